"""Dynamic per-token activation quantization (Triton): x [T, K] -> (codes [T, K], scales [T, 1]).

One program per row: a first pass over K finds max |x|, a second writes x / scale as fp8 e4m3
(saturated at +-448) or int8 (rounded half away from zero, saturated at +-127). The twin is
reference_quant.per_token_quant; scales are fp32, at least MIN_SCALE so a zero row gives codes 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference_quant import MIN_SCALE, qmax


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, n_cols, stride_x, stride_q, QMAX: tl.constexpr,
                            MIN_S: tl.constexpr, IS_INT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / QMAX, MIN_S)
    tl.store(s_ptr + row, scale)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        v = tl.minimum(tl.maximum(x / scale, -QMAX), QMAX)
        if IS_INT:
            v = tl.where(v >= 0, tl.floor(v + 0.5), tl.ceil(v - 0.5))
        tl.store(q_ptr + row * stride_q + cols, v.to(q_ptr.dtype.element_ty), mask=mask)


def per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] (fp32 / fp16 / bf16) -> (codes [T, K] of dtype fp8 e4m3 or int8, fp32 scales [T, 1])."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, K], got {tuple(x.shape)}")
    m = qmax(dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, k = x.shape
    q = torch.empty(t, k, dtype=dtype, device=x.device)
    s = torch.empty(t, 1, dtype=torch.float32, device=x.device)
    if t:
        block = min(triton.next_power_of_2(max(k, 1)), 2048)
        _per_token_quant_kernel[(t,)](x, q, s, k, x.stride(0), q.stride(0), QMAX=m, MIN_S=MIN_SCALE,
                                      IS_INT=dtype == torch.int8, BLOCK=block)
    return q, s

