"""Weight-only quantized GEMM (Triton): y = x @ dequant(W)^T, dequantized in the inner loop.

Two weight forms share the kernel (layouts: reference_quant's module doc):
    W4A16        packed int4 qweight [N, ceil(K / 8)], per-group scales and zero points (GPTQ,
                 AWQ and compressed-tensors pack-quantized are converted to this at load time)
    grouped W8   fp8 e4m3 w_q [N, K] with one scale per row and group of K (block-wise fp8)
Each K tile of W is read once per (M tile, N tile) program as rows of int32 words (8 weights
each) or bytes, along K as they lie in memory, unpacked and scaled in fp32 registers, rounded
to x's dtype and fed to tl.dot with fp32 accumulation; a weight never exists dense in memory.
A skinny M (decode) splits K across programs (fp32 partial sums, added after) so the grid
fills the GPU. Twins: reference_quant.w4a16_gemm and grouped_w8a16_gemm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _wq_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, K_SPLIT,
                    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
                    GROUP: tl.constexpr, INT4: tl.constexpr, HAS_ZERO: tl.constexpr,
                    TILE_SCALE: tl.constexpr, IEEE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One (M tile, N tile, K split) program: the sum over its K_SPLIT columns, fp32, into
    out[split] (the splits are added after). W's tiles are read as [BN, BK] rows of K, the
    order they lie in memory (int4: [BN, BK / 8] int32 words, unpacked in registers)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    split = tl.program_id(2)
    m_ok, n_ok = rm < M, rn < N
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    srow = rn.to(tl.int64) * stride_sn                                                     # [BN]
    wrow = rn.to(tl.int64) * stride_wn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < k_hi
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)                        # [BM, BK]
        if TILE_SCALE:                     # the tile lies in one group: a scale per row
            s = tl.load(s_ptr + srow + k0 // GROUP, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        else:
            s = tl.load(s_ptr + srow[:, None] + (rk // GROUP)[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)   # [BN, BK]
        if INT4:
            # one load of BK/8 words, then a reshape (gathering each word once per column
            # instead, without the reshape, is slower: benchmarks/quant_gemm.py)
            rw = k0 // 8 + tl.arange(0, BK // 8)                       # k0 is a multiple of 8
            p = tl.load(w_ptr + wrow[:, None] + rw[None, :],
                        mask=n_ok[:, None] & (rw < (K + 7) // 8)[None, :], other=0)      # int32 [BN, BK/8]
            nib = (p[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 15          # [BN, BK/8, 8]
            w = tl.reshape(nib, (BN, BK)).to(tl.float32)               # column 8j + i: word j, nibble i
            if HAS_ZERO:
                if TILE_SCALE:
                    z = tl.load(z_ptr + rn.to(tl.int64) * stride_zn + k0 // GROUP, mask=n_ok,
                                other=0).to(tl.float32)[:, None]
                else:
                    z = tl.load(z_ptr + rn[:, None].to(tl.int64) * stride_zn + (rk // GROUP)[None, :],
                                mask=n_ok[:, None] & k_ok[None, :], other=0).to(tl.float32)
                w = (w - z) * s
            else:
                w = (w - 8.0) * s
        else:
            w = tl.load(w_ptr + wrow[:, None] + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32) * s                                     # [BN, BK]
        w = tl.trans(w.to(x.dtype))                                                        # [BK, BN]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    tl.store(out_ptr + split.to(tl.int64) * stride_os + rm[:, None].to(tl.int64) * stride_om + rn[None, :],
             acc, mask=m_ok[:, None] & n_ok[None, :])


# programs a launch aims for: about two per SM of an H100 / H200 (132); a skinny M (decode)
# splits K until the grid reaches it, else 96 programs (qkv at M = 1) leave a third idle
TARGET_PROGRAMS = 264


def _tiles(m: int, group_size: int) -> tuple[int, int, int, bool]:
    """(BM, BN, BK, tile_scale): BK divides the group when it can (one scale per row a tile)."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    bk = next((b for b in (128, 64, 32) if group_size % b == 0), 64)
    return bm, 64, bk, group_size % bk == 0


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
    if m == 0 or n == 0 or k == 0:              # an empty sum: the bias alone
        y = torch.zeros(m, n, dtype=x.dtype, device=x.device)
        return y + bias.to(x.dtype) if bias is not None else y
    bm, bn, bk, tile_scale = _tiles(m, group_size)
    grid_mn = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    k_tiles = triton.cdiv(k, bk)
    splits = max(1, min(k_tiles, TARGET_PROGRAMS // grid_mn))
    k_split = triton.cdiv(k_tiles, splits) * bk                        # a multiple of BK
    splits = triton.cdiv(k, k_split)
    # [S, M, N]: fp32 partial sums, added after; one split (prefill) stores x's dtype directly
    part = torch.empty(splits, m, n, dtype=torch.float32 if splits > 1 else x.dtype, device=x.device)
    _wq_gemm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), splits)](
        x, w, scales, zeros if zeros is not None else scales, part, m, n, k, k_split,
        x.stride(0), w.stride(0), scales.stride(0), zeros.stride(0) if zeros is not None else 0,
        part.stride(0), part.stride(1), GROUP=group_size, INT4=int4, HAS_ZERO=zeros is not None,
        TILE_SCALE=tile_scale, IEEE=x.dtype == torch.float32, BM=bm, BN=bn, BK=bk)
    y = part[0] if splits == 1 else part.sum(0)
    if bias is not None:
        y = y.float() + bias.float()
    return y.to(x.dtype)


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
