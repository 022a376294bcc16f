"""Batched LoRA shrink (Triton), Punica's BGMV: every token times its own adapter's A.

    out[t] = A[indices[t]] @ x[t]    x [T, K], A [S, R, K] (S slots, R = slices x max rank),
                                     indices int [T] (-1: no adapter, the row is 0)

One program per (token, block of R rows): a gathered matrix-vector product, accumulated in
fp32 over K in BLOCK_K chunks. The indices are read on the device (a CUDA graph's input),
so a step mixing base requests and several adapters is one launch per projection.
Twin: kernels/reference_lora.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, idx_ptr, out_ptr, R, K, stride_x, stride_as, stride_ar, stride_out,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(idx_ptr + t).to(tl.int64)
    k_lim = tl.where(slot >= 0, K, 0)       # no adapter: every load masked, the row is 0
    slot = tl.maximum(slot, 0)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_lim
        x = tl.load(x_ptr + t * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)            # [BK]
        a = tl.load(a_ptr + slot * stride_as + rows[:, None] * stride_ar + ks[None, :],
                    mask=(rows[:, None] < R) & kmask[None, :], other=0.0).to(tl.float32)         # [BR, BK]
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(out_ptr + t * stride_out + rows, acc.to(out_ptr.dtype.element_ty), mask=rows < R)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [T, R] = per-token A[indices[t]] @ x[t] (module doc); the first T indices are read."""
    t, k = x.shape
    s, r, ka = a.shape
    if ka != k or out.shape != (t, r) or indices.shape[0] < t:
        raise ValueError(f"lora_shrink: x {tuple(x.shape)}, A {tuple(a.shape)}, out {tuple(out.shape)}, "
                         f"indices {tuple(indices.shape)} do not match (x [T, K], A [S, R, K], out [T, R])")
    if x.stride(-1) != 1 or a.stride(-1) != 1 or out.stride(-1) != 1 or a.stride(1) != k:
        raise ValueError("lora_shrink needs row-major x, A and out")
    if t == 0:
        return out
    block_r = min(triton.next_power_of_2(r), 64)
    block_k = min(triton.next_power_of_2(k), 256 if block_r <= 32 else 128)
    _shrink_kernel[(t, triton.cdiv(r, block_r))](x, a, indices, out, r, k, x.stride(0), a.stride(0),
                                                 a.stride(1), out.stride(0), BLOCK_R=block_r, BLOCK_K=block_k)
    return out
