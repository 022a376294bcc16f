"""Batched LoRA expand (Triton), Punica's BGMV: each token's shrunk h times its adapter's B,
added into the base layer's output, slice by slice for a merged projection (q | k | v,
gate | up: each slice has its own B rows and its own R columns of h).

    y[t, o:o+n] += scale * B[indices[t], o:o+n, :] @ h[t, ho:ho+R]    for (o, n, ho) in slices

y [T, N] in place, h [T, slices x R], B [S, N, R], indices int [T] (-1: y unchanged). One
program per (token, block of n output columns), one launch per slice; fp32 accumulation,
one rounding into y. Twin: kernels/reference_lora.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _expand_kernel(y_ptr, h_ptr, b_ptr, idx_ptr, N, R, scale, stride_y, stride_h, stride_bs, stride_bn,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(idx_ptr + t).to(tl.int64)
    n_lim = tl.where(slot >= 0, N, 0)       # no adapter: nothing loaded or stored
    slot = tl.maximum(slot, 0)
    rs = tl.arange(0, BLOCK_R)
    cmask = cols < n_lim
    h = tl.load(h_ptr + t * stride_h + rs, mask=rs < R, other=0.0).to(tl.float32)          # [BR]
    b = tl.load(b_ptr + slot * stride_bs + cols[:, None] * stride_bn + rs[None, :],
                mask=cmask[:, None] & (rs[None, :] < R), other=0.0).to(tl.float32)                  # [BN, BR]
    d = tl.sum(b * h[None, :], axis=1) * scale
    y = tl.load(y_ptr + t * stride_y + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * stride_y + cols, (y + d).to(y_ptr.dtype.element_ty), mask=cmask)


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, indices: torch.Tensor,
                slices: Sequence[tuple[int, int, int]], scale: float = 1.0) -> torch.Tensor:
    """y += per-token B[indices[t]] @ h[t], slice by slice (module doc); returns y."""
    t, n_all = y.shape
    s, nb, r = b.shape
    if nb != n_all or h.shape[0] != t or indices.shape[0] < t:
        raise ValueError(f"lora_expand: y {tuple(y.shape)}, h {tuple(h.shape)}, B {tuple(b.shape)}, "
                         f"indices {tuple(indices.shape)} do not match (y [T, N], h [T, .], B [S, N, R])")
    if t == 0 or n_all == 0:
        return y
    if y.stride(-1) != 1 or h.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("lora_expand needs row-major y, h and B")
    block_r = triton.next_power_of_2(r)
    for o, n, ho in slices:
        if o < 0 or n < 0 or o + n > n_all or ho < 0 or ho + r > h.shape[1]:
            raise ValueError(f"lora_expand: slice {(o, n, ho)} is outside y [.., {n_all}] or h [.., {h.shape[1]}]")
        if n == 0:
            continue
        block_n = min(triton.next_power_of_2(n), max(16, 4096 // block_r))
        _expand_kernel[(t, triton.cdiv(n, block_n))](
            y[:, o:], h[:, ho:], b[:, o:], indices, n, r, float(scale), y.stride(0), h.stride(0),
            b.stride(0), b.stride(1), BLOCK_N=block_n, BLOCK_R=block_r)
    return y
