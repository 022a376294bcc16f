"""W8A8 GEMM for skinny M (decode) in Triton: (a_q x a_scale) @ (w_q x w_scale)^T, split over K.

cuBLASLt's fp8 GEMM and torch._int_mm tile M for prefill; at a decode step's few rows they read
the weight well below the copy bandwidth (`python -m benchmarks quant_gemm` times both). Here
each program reads a [BN, BK] tile of W per K step along its rows, feeds the 8-bit codes of a
and W straight to tl.dot (fp8 -> fp32, int8 -> int32 accumulation on the tensor cores), and K is
split across programs until the grid fills the GPU; the per-token and per-channel scales
multiply each split's sum once, the splits are added after.
Twin: reference_quant.scaled_mm (same signature).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# programs a launch aims for: two per SM of an H100 / H200 (132 SMs)
TARGET_PROGRAMS = 264


@triton.jit
def _skinny_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, K_SPLIT,
                   stride_am, stride_wn, stride_os, stride_om,
                   INT8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    split = tl.program_id(2)
    m_ok, n_ok = rm < M, rn < N
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros((BM, BN), dtype=tl.int32 if INT8 else tl.float32)
    zero = 0 if INT8 else 0.0
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < k_hi
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=zero)                       # [BM, BK]
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=zero)                       # [BN, BK]
        acc += tl.dot(a, tl.trans(w))
    sa = tl.load(as_ptr + rm, mask=m_ok, other=0.0)                                        # [BM]
    sw = tl.load(ws_ptr + rn, mask=n_ok, other=0.0)                                        # [BN]
    y = acc.to(tl.float32) * sa[:, None] * sw[None, :]
    tl.store(out_ptr + split.to(tl.int64) * stride_os + rm[:, None].to(tl.int64) * stride_om + rn[None, :],
             y, mask=m_ok[:, None] & n_ok[None, :])


def scaled_mm_skinny(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                     bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """a_q [M, K], a_scale fp32 [M, 1], w_q [N, K] (fp8 e4m3 or int8, same as a_q), w_scale fp32
    [N] (or [N, 1]) -> [M, N] of out_dtype (+ bias)."""
    if a_q.dtype != w_q.dtype or a_q.dtype not in (torch.float8_e4m3fn, torch.int8):
        raise ValueError(f"a_q and w_q must both be float8_e4m3fn or both int8, got {a_q.dtype} and {w_q.dtype}")
    m, k = a_q.shape
    n = w_q.shape[0]
    if w_q.shape[1] != k or a_scale.numel() != m or w_scale.numel() != n:
        raise ValueError(f"shapes do not agree: a_q {tuple(a_q.shape)}, a_scale {tuple(a_scale.shape)}, "
                         f"w_q {tuple(w_q.shape)}, w_scale {tuple(w_scale.shape)} (want [M, K], [M, 1], [N, K], [N])")
    if m == 0 or n == 0 or k == 0:              # an empty sum: the bias alone
        y = torch.zeros(m, n, dtype=out_dtype, device=a_q.device)
        return y + bias.to(out_dtype) if bias is not None else y
    a_q = a_q if a_q.stride(-1) == 1 else a_q.contiguous()
    w_q = w_q.contiguous()
    sa = a_scale.float().reshape(m).contiguous()
    sw = w_scale.float().reshape(n).contiguous()
    bm, bn, bk = 16, 64, 128                   # tl.dot's smallest M; K tiles of 128 bytes a row
    grid_mn = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    k_tiles = triton.cdiv(k, bk)
    k_split = triton.cdiv(k_tiles, max(1, min(k_tiles, TARGET_PROGRAMS // grid_mn))) * bk
    splits = triton.cdiv(k, k_split)
    # [S, M, N]: fp32 partial sums, added after; one split stores out_dtype directly
    part = torch.empty(splits, m, n, dtype=torch.float32 if splits > 1 else out_dtype, device=a_q.device)
    _skinny_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), splits)](
        a_q, sa, w_q, sw, part, m, n, k, k_split, a_q.stride(0), w_q.stride(0), part.stride(0), part.stride(1),
        INT8=a_q.dtype == torch.int8, BM=bm, BN=bn, BK=bk)
    y = part[0] if splits == 1 else part.sum(0)
    if bias is not None:
        y = y.float() + bias.float()
    return y.to(out_dtype)
