"""Weight-only quantized GEMM (Triton): y = x @ dequant(W)^T, dequantized in the inner loop.

Two weight forms share the kernel (layouts: reference_quant's module doc):
    W4A16        packed int4 qweight [N, ceil(K / 8)], per-group scales and zero points (GPTQ,
                 AWQ and compressed-tensors pack-quantized are converted to this at load time)
    grouped W8   fp8 e4m3 w_q [N, K] with one scale per row and group of K (block-wise fp8)
Each K tile of W is read once per (M tile, N tile) program as int32 words (8 weights each) or
bytes, unpacked and scaled in fp32 registers, rounded to x's dtype and fed to tl.dot with fp32
accumulation; a weight never exists dense in memory. Twins: reference_quant.w4a16_gemm and
grouped_w8a16_gemm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _wq_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K,
                    stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
                    GROUP: tl.constexpr, INT4: tl.constexpr, HAS_ZERO: tl.constexpr,
                    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)                        # [BM, BK]
        wmask = k_ok[:, None] & n_ok[None, :]
        wrow = rn[None, :].to(tl.int64) * stride_wn
        g = rk // GROUP                                                                    # [BK]
        s = tl.load(s_ptr + rn[None, :].to(tl.int64) * stride_sn + g[:, None], mask=wmask, other=0.0)
        if INT4:
            p = tl.load(w_ptr + wrow + (rk // 8)[:, None], mask=wmask, other=0)          # int32 [BK, BN]
            w = ((p >> ((rk % 8) * 4)[:, None]) & 15).to(tl.float32)
            if HAS_ZERO:
                z = tl.load(z_ptr + rn[None, :].to(tl.int64) * stride_zn + g[:, None], mask=wmask,
                            other=0).to(tl.float32)
                w = (w - z) * s
            else:
                w = (w - 8.0) * s
        else:
            w = tl.load(w_ptr + wrow + rk[:, None], mask=wmask, other=0.0).to(tl.float32) * s
        w = w.to(x.dtype)                                                                  # [BK, BN]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
            group_size: int, bias: torch.Tensor | None, n: int, int4: bool) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {tuple(x.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    m, k = x.shape
    groups = -(-k // group_size)
    if scales.shape != (n, groups):
        raise ValueError(f"scales must be [{n}, {groups}] (rows, ceil(K / group_size)), got {tuple(scales.shape)}")
    if zeros is not None and zeros.shape != (n, groups):
        raise ValueError(f"zeros must be [{n}, {groups}], got {tuple(zeros.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    w, scales = w.contiguous(), scales.contiguous()
    zeros = zeros.contiguous() if zeros is not None else None
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    bn, bk = 64, 64
    _wq_gemm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        x, w, scales, zeros if zeros is not None else scales, bias if bias is not None else scales, out,
        m, n, k, x.stride(0), w.stride(0), scales.stride(0), zeros.stride(0) if zeros is not None else 0,
        out.stride(0), GROUP=group_size, INT4=int4, HAS_ZERO=zeros is not None, HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, BM=bm, BN=bn, BK=bk)
    return out


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(qweight int32 [N, ceil(K / 8)], scales [N, G], zeros uint8 [N, G] or None
    (= 8)) ^T (+ bias) -> [M, N] in x's dtype."""
    k = x.shape[-1]
    if qweight.dtype != torch.int32 or qweight.shape[1] != -(-k // 8):
        raise ValueError(f"qweight must be int32 [N, {-(-k // 8)}] for K={k}, got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    return _launch(x, qweight, scales, zeros, group_size, bias, qweight.shape[0], True)


def grouped_w8a16_gemm(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor, group_size: int,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (w_q [N, K] x scales [N, ceil(K / group_size)] per group)^T -> [M, N] in x's dtype."""
    if w_q.shape[1] != x.shape[-1]:
        raise ValueError(f"w_q must be [N, {x.shape[-1]}], got {tuple(w_q.shape)}")
    return _launch(x, w_q, scales, None, group_size, bias, w_q.shape[0], False)
