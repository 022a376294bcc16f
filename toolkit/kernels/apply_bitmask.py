"""Packed token bitmask applied to logits in place (Triton): -inf where the bit is 0.

bitmask int32 [M, ceil(V/32)], bit v%32 of word v//32 set = token v allowed (the layout of
xgrammar / outlines-core bitmasks). Logits row r reads mask row r, or rows[r] when given (a
table of grammar-state rows shared by many logits rows: `MaskTable`).
Grid: (rows, blocks of the vocabulary).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(logits_ptr, mask_ptr, rows_ptr, n_cols, stride, mask_stride,
                          HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    mask_row = tl.load(rows_ptr + row).to(tl.int64) if HAS_ROWS else row
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    words = tl.load(mask_ptr + mask_row * mask_stride + cols // 32, mask=inside, other=-1)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride + cols, float("-inf"), mask=inside & ~allowed)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                        rows: torch.Tensor | None = None, *, block: int = 1024) -> None:
    """In place: logits[r, v] = -inf where bit v of mask row r (or rows[r]) is 0.

    logits float [N, V]; bitmask int32 [N, ceil(V/32)], or [M, ceil(V/32)] with rows int32 /
    int64 [N] in [0, M) (not checked here: SamplingMetadata.build checks them on the host).
    """
    assert logits.dim() == 2 and logits.stride(1) == 1 and bitmask.dtype == torch.int32
    n, v = logits.shape
    want = ((bitmask.shape[0] if rows is not None else n), (v + 31) // 32)
    assert tuple(bitmask.shape) == want, (tuple(bitmask.shape), n, v)
    assert rows is None or tuple(rows.shape) == (n,), (tuple(rows.shape), n)
    if n:
        block = min(block, triton.next_power_of_2(v))
        bitmask = bitmask.contiguous()
        rows_arg = rows.contiguous() if rows is not None else bitmask   # read only with HAS_ROWS
        _apply_bitmask_kernel[(n, triton.cdiv(v, block))](
            logits, bitmask, rows_arg, v, logits.stride(0), bitmask.stride(0),
            HAS_ROWS=rows is not None, BLOCK=block)
