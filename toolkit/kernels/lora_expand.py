"""Batched LoRA expand (Triton): each token's shrunk h times its adapter's B, added into the
base layer's output, slice by slice for a merged projection (q | k | v, gate | up: each slice
has its own B rows and its own R columns of h).

    y[t, o:o+n] += scale * B[indices[t], o:o+n, :] @ h[t, ho:ho+R]    for (o, n, ho) in slices

y [T, N] in place, h [T, slices x R] (fp32), B [S, N, R], indices int [T] (-1: y unchanged).
One program per (tile of BLOCK_T consecutive tokens, block of n output columns), one launch
per slice. A tile that runs one adapter is a tiled GEMM (tl.dot over R in blocks; h is cast
to B's dtype for it, as vLLM's expand does); a tile mixing adapters runs one matrix-vector
product per token; base-model tiles are skipped. fp32 accumulation, one rounding into y.
Twin: kernels/reference_lora.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_T = 16


@triton.jit
def _expand_kernel(y_ptr, h_ptr, b_ptr, idx_ptr, T, N, R, scale, stride_y, stride_h, stride_bs, stride_bn,
                   BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   PRECISION: tl.constexpr):
    first = tl.program_id(0) * BLOCK_T
    toks = first + tl.arange(0, BLOCK_T)
    tmask = toks < T
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = cols < N
    s0 = tl.load(idx_ptr + first).to(tl.int64)
    slots = tl.load(idx_ptr + toks, mask=tmask, other=0).to(tl.int64)
    same = tl.where(tmask, slots, s0)
    uniform = (tl.min(same, axis=0) == s0) & (tl.max(same, axis=0) == s0)
    if uniform:
        if s0 >= 0:                          # one adapter over the tile: a GEMM
            acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
            for r0 in range(0, R, BLOCK_R):
                rs = r0 + tl.arange(0, BLOCK_R)
                rmask = rs < R
                b = tl.load(b_ptr + s0 * stride_bs + cols[None, :] * stride_bn + rs[:, None],
                            mask=rmask[:, None] & nmask[None, :], other=0.0)                     # [BR, BN]
                h = tl.load(h_ptr + toks.to(tl.int64)[:, None] * stride_h + rs[None, :],
                            mask=tmask[:, None] & rmask[None, :], other=0.0)                     # [BT, BR]
                acc += tl.dot(h.to(b.dtype), b, input_precision=PRECISION)
            ys = y_ptr + toks.to(tl.int64)[:, None] * stride_y + cols[None, :]
            m = tmask[:, None] & nmask[None, :]
            y = tl.load(ys, mask=m, other=0.0).to(tl.float32)
            tl.store(ys, (y + acc * scale).to(y_ptr.dtype.element_ty), mask=m)
    else:                                    # mixed adapters: one matrix-vector product per token
        for j in range(BLOCK_T):
            t = first + j
            if t < T:
                slot = tl.load(idx_ptr + t).to(tl.int64)
                n_lim = tl.where(slot >= 0, N, 0)       # no adapter: nothing loaded or stored
                slot = tl.maximum(slot, 0)
                cmask = cols < n_lim
                d = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for r0 in range(0, R, BLOCK_R):
                    rs = r0 + tl.arange(0, BLOCK_R)
                    h1 = tl.load(h_ptr + t.to(tl.int64) * stride_h + rs, mask=rs < R, other=0.0).to(tl.float32)
                    b1 = tl.load(b_ptr + slot * stride_bs + cols[:, None] * stride_bn + rs[None, :],
                                 mask=cmask[:, None] & (rs[None, :] < R), other=0.0).to(tl.float32)  # [BN, BR]
                    d += tl.sum(b1 * h1[None, :], axis=1)
                yp = y_ptr + t.to(tl.int64) * stride_y + cols
                y1 = tl.load(yp, mask=cmask, other=0.0).to(tl.float32)
                tl.store(yp, (y1 + d * scale).to(y_ptr.dtype.element_ty), mask=cmask)


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, indices: torch.Tensor,
                slices: Sequence[tuple[int, int, int]], scale: float = 1.0) -> torch.Tensor:
    """y += per-token B[indices[t]] @ h[t], slice by slice (module doc); returns y."""
    t, n_all = y.shape
    s, nb, r = b.shape
    if nb != n_all or h.shape[0] != t or indices.shape[0] < t:
        raise ValueError(f"lora_expand: y {tuple(y.shape)}, h {tuple(h.shape)}, B {tuple(b.shape)}, "
                         f"indices {tuple(indices.shape)} do not match (y [T, N], h [T, .], B [S, N, R])")
    for o, n, ho in slices:
        if o < 0 or n < 0 or o + n > n_all or ho < 0 or ho + r > h.shape[1]:
            raise ValueError(f"lora_expand: slice {(o, n, ho)} is outside y [.., {n_all}] or h [.., {h.shape[1]}]")
    if t == 0 or n_all == 0:
        return y
    if y.stride(-1) != 1 or h.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("lora_expand needs row-major y, h and B")
    block_r = max(16, min(triton.next_power_of_2(r), 64))        # tl.dot needs >= 16
    block_n = 64
    for o, n, ho in slices:
        if n == 0:
            continue
        _expand_kernel[(triton.cdiv(t, BLOCK_T), triton.cdiv(n, block_n))](
            y[:, o:], h[:, ho:], b[:, o:], indices, t, n, r, float(scale), y.stride(0), h.stride(0),
            b.stride(0), b.stride(1), BLOCK_T=BLOCK_T, BLOCK_N=block_n, BLOCK_R=block_r,
            PRECISION="ieee" if b.dtype == torch.float32 else "tf32")
    return y
