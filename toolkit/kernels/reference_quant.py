"""Pure-torch twins of the quantized-linear kernels (quant_act.py, quant_w8a8.py, quant_w4a16.py,
fused_quant.py).

Same signatures as the launchers; the test oracle and the CPU path. Each GEMM twin
dequantizes to fp32 and multiplies there, so in fp32 it is the exact product of the
dequantized operands (an integer product of int8 operands is exact below K = 1024).

Layouts (every quantized method converts its checkpoint into these at load time):
    W8A8    w_q [N, K] float8_e4m3fn or int8, w_scale fp32 [N] (one per output row)
    W4      qweight int32 [N, ceil(K / 8)]: K-element k of row n is the unsigned nibble
            (qweight[n, k // 8] >> 4 * (k % 8)) & 15 (compressed-tensors' pack_to_int32);
            scales fp32 [N, G], zeros uint8 [N, G] or None (= 8, symmetric), G = ceil(K / group);
            w[n, k] = (u - zero[n, k // group]) * scale[n, k // group]
    grouped W8  w_q [N, K] fp8, scales fp32 [N, ceil(K / group)] (block-wise fp8, rows expanded)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from toolkit.kernels import reference_model

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
INT8_MAX = 127.0
MIN_SCALE = 1e-12        # a zero row's scale: its codes are all 0, never a division by 0


def qmax(dtype: torch.dtype) -> float:
    if dtype == FP8:
        return FP8_MAX
    if dtype == torch.int8:
        return INT8_MAX
    raise ValueError(f"quantized dtype must be torch.float8_e4m3fn or torch.int8, got {dtype}")


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero (what the Triton kernel does with floor / ceil)."""
    return torch.where(v >= 0, torch.floor(v + 0.5), torch.ceil(v - 0.5))


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [T, K] / scale (broadcast: [T, 1] or a scalar) -> codes of `dtype` [T, K], saturated."""
    m = qmax(dtype)
    v = (x.float() / scale).clamp(-m, m)
    return round_half_away(v).to(dtype) if dtype == torch.int8 else v.to(dtype)


def per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization: x [T, K] -> (codes [T, K] of `dtype`, fp32 scales [T, 1]),
    scale = max(|x| over the row) / qmax (at least MIN_SCALE), codes = x / scale."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, K], got {tuple(x.shape)}")
    amax = x.float().abs().amax(dim=-1, keepdim=True) if x.shape[1] else x.new_zeros(x.shape[0], 1, dtype=torch.float32)
    scale = (amax / qmax(dtype)).clamp(min=MIN_SCALE)
    return quantize_with_scale(x, scale, dtype), scale


def per_token_group_quant(x: torch.Tensor, group: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic quantization per token and group of K columns (block-wise fp8's activations):
    x [T, K] -> (codes [T, K], fp32 scales [T, ceil(K / group)])."""
    t, k = x.shape
    g = -(-k // group)
    xg = F.pad(x.float(), (0, g * group - k)).reshape(t, g, group)
    scale = (xg.abs().amax(dim=-1) / qmax(dtype)).clamp(min=MIN_SCALE)              # [T, G]
    q = quantize_with_scale(xg, scale[..., None], dtype).reshape(t, g * group)[:, :k]
    return q, scale


def scaled_mm(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """W8A8: (a_q [M, K] x a_scale [M, 1]) @ (w_q [N, K] x w_scale [N])^T (+ bias) -> [M, N]."""
    y = (a_q.float() @ w_q.float().t()) * a_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def unpack_int4(qweight: torch.Tensor, k: int) -> torch.Tensor:
    """qweight int32 [N, ceil(K / 8)] -> unsigned nibbles uint8 [N, K] (layout: module doc)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)        # [8]
    u = (qweight.unsqueeze(-1) >> shifts) & 15                                      # [N, K/8, 8]
    return u.reshape(qweight.shape[0], -1)[:, :k].to(torch.uint8)


def pack_int4(u: torch.Tensor) -> torch.Tensor:
    """Unsigned nibbles [N, K] (0..15) -> int32 [N, ceil(K / 8)]; the inverse of unpack_int4."""
    n, k = u.shape
    padded = torch.zeros(n, -(-k // 8) * 8, dtype=torch.int64, device=u.device)
    padded[:, :k] = u.to(torch.int64)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=u.device)
    words = (padded.reshape(n, -1, 8) << shifts).sum(-1)                            # < 2^32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def group_expand(t: torch.Tensor, group: int, k: int) -> torch.Tensor:
    """[N, G] per-group values -> [N, K] per-element (column c takes group c // group)."""
    return t.repeat_interleave(group, dim=1)[:, :k]


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    group_size: int, k: int) -> torch.Tensor:
    """The dense fp32 [N, K] of a W4 weight."""
    u = unpack_int4(qweight, k).float()
    z = 8.0 if zeros is None else group_expand(zeros.float(), group_size, k)
    return (u - z) * group_expand(scales.float(), group_size, k)


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W4A16: x [M, K] @ dequant(W)^T (+ bias) -> [M, N] in x's dtype; the weight is rounded to
    x's dtype after dequantizing (what the kernel feeds its dot), the sum is fp32."""
    k = x.shape[1]
    w = dequantize_int4(qweight, scales, zeros, group_size, k).to(x.dtype).float()
    y = F.linear(x.float(), w, None if bias is None else bias.float())
    return y.to(x.dtype)


def dequantize_grouped(w_q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The dense fp32 [N, K] of a weight with one scale per row and group of columns."""
    return w_q.float() * group_expand(scales.float(), group_size, w_q.shape[1])


def grouped_w8a16_gemm(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor, group_size: int,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """Block-wise fp8 weights, unquantized activations: x [M, K] @ dequant(W)^T -> [M, N]."""
    w = dequantize_grouped(w_q, scales, group_size).to(x.dtype).float()
    y = F.linear(x.float(), w, None if bias is None else bias.float())
    return y.to(x.dtype)


def rms_norm_dynamic_per_token_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype,
                                     residual: torch.Tensor | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Twin of fused_quant's: the RMSNorm twin (+ residual), then per-token quantization of its
    [T, N] rows -> (codes, fp32 scales [T, 1], the new residual)."""
    normed, new_residual = reference_model.rms_norm(x, weight, eps, residual)
    q, s = per_token_quant(normed.reshape(-1, x.shape[-1]), dtype)
    return q, s, new_residual


def silu_and_mul_per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of fused_quant's: silu(gate) * up in x's dtype, then per-token quantization."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {tuple(x.shape)}")
    y = reference_model.silu_and_mul(x)
    return per_token_quant(y.reshape(-1, y.shape[-1]), dtype)
