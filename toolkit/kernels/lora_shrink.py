"""Batched LoRA shrink (Triton): every token times its own adapter's A.

    out[t] = A[indices[t]] @ x[t]    x [T, K], A [S, R, K] (S slots, R = parts x max rank),
                                     indices int [T] (-1: no adapter, the row is 0)

One program per (tile of BLOCK_T consecutive tokens, block of R rows). The tokens of a
request are consecutive, so in a prefill chunk a tile usually runs one adapter: the program
then does a tiled GEMM (tl.dot) against that adapter's A (Punica's SGMV case). A tile that
mixes adapters (decodes of several requests) runs one gathered matrix-vector product per
token (Punica's BGMV); a tile of base-model tokens writes zeros. fp32 accumulation. The
indices are read on the device (a CUDA graph's input), so a step mixing base requests and
several adapters is one launch per projection. Twin: kernels/reference_lora.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, idx_ptr, out_ptr, T, R, K, stride_x, stride_as, stride_ar, stride_out,
                   BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    first = tl.program_id(0) * BLOCK_T
    toks = first + tl.arange(0, BLOCK_T)
    tmask = toks < T
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    s0 = tl.load(idx_ptr + first).to(tl.int64)
    slots = tl.load(idx_ptr + toks, mask=tmask, other=0).to(tl.int64)
    same = tl.where(tmask, slots, s0)
    uniform = (tl.min(same, axis=0) == s0) & (tl.max(same, axis=0) == s0)
    out_rows = out_ptr + toks.to(tl.int64)[:, None] * stride_out + rows[None, :]
    if uniform:
        acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
        if s0 >= 0:                          # one adapter over the tile: a GEMM
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                kmask = ks < K
                x = tl.load(x_ptr + toks.to(tl.int64)[:, None] * stride_x + ks[None, :],
                            mask=tmask[:, None] & kmask[None, :], other=0.0)                     # [BT, BK]
                a = tl.load(a_ptr + s0 * stride_as + rows[None, :] * stride_ar + ks[:, None],
                            mask=kmask[:, None] & rmask[None, :], other=0.0)                     # [BK, BR]
                acc += tl.dot(x, a, input_precision=PRECISION)
        tl.store(out_rows, acc.to(out_ptr.dtype.element_ty), mask=tmask[:, None] & rmask[None, :])
    else:                                    # mixed adapters: one matrix-vector product per token
        for j in range(BLOCK_T):
            t = first + j
            if t < T:
                slot = tl.load(idx_ptr + t).to(tl.int64)
                k_lim = tl.where(slot >= 0, K, 0)       # no adapter: every load masked, the row is 0
                slot = tl.maximum(slot, 0)
                acc1 = tl.zeros((BLOCK_R,), dtype=tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    ks = k0 + tl.arange(0, BLOCK_K)
                    kmask = ks < k_lim
                    x1 = tl.load(x_ptr + t.to(tl.int64) * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)
                    a1 = tl.load(a_ptr + slot * stride_as + rows[:, None] * stride_ar + ks[None, :],
                                 mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # [BR, BK]
                    acc1 += tl.sum(a1 * x1[None, :], axis=1)
                tl.store(out_ptr + t.to(tl.int64) * stride_out + rows, acc1.to(out_ptr.dtype.element_ty),
                         mask=rmask)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [T, R] = per-token A[indices[t]] @ x[t] (module doc); the first T indices are read."""
    t, k = x.shape
    s, r, ka = a.shape
    if ka != k or out.shape != (t, r) or indices.shape[0] < t:
        raise ValueError(f"lora_shrink: x {tuple(x.shape)}, A {tuple(a.shape)}, out {tuple(out.shape)}, "
                         f"indices {tuple(indices.shape)} do not match (x [T, K], A [S, R, K], out [T, R])")
    if x.dtype != a.dtype:
        raise ValueError(f"lora_shrink: x is {x.dtype} but A is {a.dtype}; they must match")
    if x.stride(-1) != 1 or a.stride(-1) != 1 or out.stride(-1) != 1 or a.stride(1) != k:
        raise ValueError("lora_shrink needs row-major x, A and out")
    if t == 0:
        return out
    block_r = max(16, min(triton.next_power_of_2(r), 64))        # tl.dot needs >= 16
    block_k = max(16, min(triton.next_power_of_2(k), 64))
    _shrink_kernel[(triton.cdiv(t, BLOCK_T), triton.cdiv(r, block_r))](
        x, a, indices, out, t, r, k, x.stride(0), a.stride(0), a.stride(1), out.stride(0),
        BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_K=block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
    return out
