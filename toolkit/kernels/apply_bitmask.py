"""Packed token bitmask applied to logits in place (Triton): -inf where the bit is 0.

bitmask int32 [N, ceil(V/32)], bit v%32 of word v//32 set = token v allowed (the layout of
xgrammar / outlines-core bitmasks). Grid: (rows, blocks of the vocabulary).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(logits_ptr, mask_ptr, n_cols, stride, mask_stride,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    words = tl.load(mask_ptr + row * mask_stride + cols // 32, mask=inside, other=-1)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride + cols, float("-inf"), mask=inside & ~allowed)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, *, block: int = 1024) -> None:
    """In place: logits[r, v] = -inf where bit v of row r is 0 (bit v%32 of word v//32).

    logits float [N, V]; bitmask int32 [N, ceil(V/32)] (bit set = allowed).
    """
    assert logits.dim() == 2 and logits.stride(1) == 1 and bitmask.dtype == torch.int32
    n, v = logits.shape
    assert bitmask.shape == (n, (v + 31) // 32), (tuple(bitmask.shape), n, v)
    if n:
        block = min(block, triton.next_power_of_2(v))
        _apply_bitmask_kernel[(n, triton.cdiv(v, block))](
            logits, bitmask.contiguous(), v, logits.stride(0), bitmask.contiguous().stride(0),
            BLOCK=block)
