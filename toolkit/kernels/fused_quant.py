"""Activation quantization fused with what produces the activation (Triton), so a W8A8 layer's
input is written once, as 8-bit codes, instead of written dense and read back to quantize:

* `rms_norm_dynamic_per_token_quant`: RMSNorm (+ the residual add) -> per-token codes + scales,
  what a decoder layer's norm hands its q|k|v or gate|up projection (vLLM's name);
* `silu_and_mul_per_token_quant`: SiLU(gate) * up -> per-token codes + scales, what the MLP's
  activation hands down_proj (rows wider than MAX_ONE_BLOCK: a max pass, then a quantize pass
  that recomputes from the row it just read).

Each rounds its dense result to the activation dtype before quantizing, as the unfused norm /
activation then `quant_act.per_token_quant` do, so the codes are the unfused path's. Scales are
fp32 [T, 1], at least MIN_SCALE (a zero row gives codes 0). Twins: reference_quant's functions
of the same names.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference_model import check_rms_norm
from toolkit.kernels.reference_quant import MIN_SCALE, qmax

MAX_ONE_BLOCK = 4096          # SiLU rows up to this width are held in registers (one read of gate|up)


@triton.jit
def _quantize(v, scale, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    v = tl.minimum(tl.maximum(v / scale, -QMAX), QMAX)
    if IS_INT:
        v = tl.where(v >= 0, tl.floor(v + 0.5), tl.ceil(v - 0.5))     # half away from zero
    return v


@triton.jit
def _rms_norm_quant_kernel(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, n_cols, stride_x, stride_res,
                           stride_q, stride_res_out, eps, QMAX: tl.constexpr, MIN_S: tl.constexpr,
                           IS_INT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)   # the stream's dtype
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * y).to(x_ptr.dtype.element_ty).to(tl.float32)           # the unfused norm's output
    y = tl.where(mask, y, 0.0)
    scale = tl.maximum(tl.max(tl.abs(y), axis=0) / QMAX, MIN_S)
    tl.store(s_ptr + row, scale)
    q = _quantize(y, scale, QMAX, IS_INT)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul(x_ptr, row, stride_x, cols, mask, n_cols, OUT_TY: tl.constexpr):
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = (gate / (1.0 + tl.exp(-gate)) * up).to(OUT_TY).to(tl.float32)    # the unfused output
    return tl.where(mask, y, 0.0)


@triton.jit
def _silu_and_mul_quant_kernel(x_ptr, q_ptr, s_ptr, n_cols, stride_x, stride_q, QMAX: tl.constexpr,
                               MIN_S: tl.constexpr, IS_INT: tl.constexpr, ONE_BLOCK: tl.constexpr,
                               BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if ONE_BLOCK:                                     # the row stays in registers: one read
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        y = _silu_mul(x_ptr, row, stride_x, cols, mask, n_cols, x_ptr.dtype.element_ty)
        scale = tl.maximum(tl.max(tl.abs(y), axis=0) / QMAX, MIN_S)
        tl.store(s_ptr + row, scale)
        q = _quantize(y, scale, QMAX, IS_INT)
        tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):         # pass 1: the row's max |silu(g) * u|
            cols = start + tl.arange(0, BLOCK)
            y = _silu_mul(x_ptr, row, stride_x, cols, cols < n_cols, n_cols, x_ptr.dtype.element_ty)
            amax = tl.maximum(amax, tl.abs(y))
        scale = tl.maximum(tl.max(amax, axis=0) / QMAX, MIN_S)
        tl.store(s_ptr + row, scale)
        for start in range(0, n_cols, BLOCK):         # pass 2: recompute from the row just read
            cols = start + tl.arange(0, BLOCK)        # (4 I bytes per token: L2-resident)
            mask = cols < n_cols
            y = _silu_mul(x_ptr, row, stride_x, cols, mask, n_cols, x_ptr.dtype.element_ty)
            q = _quantize(y, scale, QMAX, IS_INT)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm_dynamic_per_token_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype,
                                     residual: torch.Tensor | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., N] (+ residual [..., N]), weight [N] -> (codes [T, N] of `dtype` (fp8 e4m3 or int8),
    fp32 scales [T, 1], the new residual [..., N]) with T the rows of x; without a residual the
    new residual is x itself."""
    check_rms_norm(x, weight, residual)
    m, n = qmax(dtype), x.shape[-1]
    x2 = _rows(x, n)                                                     # [T, N]
    t = x2.shape[0]
    res2 = x2 if residual is None else _rows(residual, n)
    res_out = x2 if residual is None else torch.empty_like(x2)
    q = torch.empty(t, n, dtype=dtype, device=x.device)
    s = torch.empty(t, 1, dtype=torch.float32, device=x.device)
    if t:
        block = triton.next_power_of_2(n)
        _rms_norm_quant_kernel[(t,)](x2, res2, weight, q, s, res_out, n, x2.stride(0), res2.stride(0),
                                     q.stride(0), res_out.stride(0), float(eps), QMAX=m, MIN_S=MIN_SCALE,
                                     IS_INT=dtype == torch.int8, HAS_RESIDUAL=residual is not None,
                                     BLOCK=block, num_warps=min(max(block // 512, 1), 16))
    return q, s, (x if residual is None else res_out.view(x.shape))


def silu_and_mul_per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., 2I] (gate | up) -> (codes of silu(gate) * up [T, I] of `dtype`, fp32 scales [T, 1])."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {tuple(x.shape)}")
    m, i = qmax(dtype), x.shape[-1] // 2
    x2 = _rows(x, 2 * i)                                                  # [T, 2I]
    t = x2.shape[0]
    q = torch.empty(t, i, dtype=dtype, device=x.device)
    s = torch.empty(t, 1, dtype=torch.float32, device=x.device)
    if t:
        block = min(triton.next_power_of_2(max(i, 1)), MAX_ONE_BLOCK)
        _silu_and_mul_quant_kernel[(t,)](x2, q, s, i, x2.stride(0), q.stride(0), QMAX=m, MIN_S=MIN_SCALE,
                                         IS_INT=dtype == torch.int8, ONE_BLOCK=i <= block, BLOCK=block,
                                         num_warps=min(max(block // 512, 1), 8))
    return q, s
