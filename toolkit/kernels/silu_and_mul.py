"""SiLU-and-multiply of a merged gate|up projection (Triton): out = silu(gate) * up.

x [T, 2I] holds gate in columns [0, I) and up in [I, 2I) (the merged gate_up matmul).
Computed in fp32 and rounded once. Grid: (rows, column blocks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  [..., I], in x's dtype (into `out` if given)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {tuple(x.shape)}")
    i = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    shape = (*x.shape[:-1], i)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif out.shape != shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be contiguous {shape} {x.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    result, out = out, out.view(-1, i)  # [rows, I]
    if x2.shape[0] and i:
        block = min(triton.next_power_of_2(i), 1024)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(i, block))](
            x2,
            out,
            i,
            x2.stride(0),
            out.stride(0),
            BLOCK=block,
        )
    return result
