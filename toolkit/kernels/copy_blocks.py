"""copy_blocks: for every layer cache, block dst[i] <- block src[i], K and V (copy-on-write).

Each block [BS, H_kv, D] is contiguous, so a block is copied as a flat run of elements;
one program per (pair, K/V, chunk of the block). One launch per layer: copy-on-write is
rare and the layer count small. Twin: toolkit.kernels.reference.copy_blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_blocks_kernel(cache_ptr, src_ptr, dst_ptr, stride_c0, stride_cb, block_numel,
                        BLOCK: tl.constexpr):
    pair = tl.program_id(0)
    kv = tl.program_id(1)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)           # [BLOCK] within the block
    mask = offs < block_numel
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    base = cache_ptr + kv.to(tl.int64) * stride_c0
    x = tl.load(base + src * stride_cb + offs, mask=mask)
    tl.store(base + dst * stride_cb + offs, x, mask=mask)


def check_copy_blocks_args(kv_caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    if src.dim() != 1 or dst.shape != src.shape or src.dtype.is_floating_point or dst.dtype.is_floating_point:
        raise ValueError(f"src and dst must be integer tensors [n] of one length, got "
                         f"{src.dtype} {tuple(src.shape)} and {dst.dtype} {tuple(dst.shape)}")
    for i, c in enumerate(kv_caches):
        if c.dim() != 5 or c.shape[0] != 2:
            raise ValueError(f"kv_caches[{i}] must be [2, NB, BS, H_kv, D], got {tuple(c.shape)}")


def copy_blocks(kv_caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """src, dst: int [n] block ids on the caches' device; dst distinct and disjoint from src."""
    check_copy_blocks_args(kv_caches, src, dst)
    n = src.shape[0]
    if n == 0:
        return
    for i, cache in enumerate(kv_caches):                          # [2, NB, BS, H_kv, D]
        if not cache[0, 0].is_contiguous():
            raise ValueError(f"kv_caches[{i}]: each block [BS, H_kv, D] must be contiguous, got strides "
                             f"{cache.stride()}")
        numel = cache[0, 0].numel()
        block = min(triton.next_power_of_2(numel), 4096)
        grid = (n, 2, triton.cdiv(numel, block))
        _copy_blocks_kernel[grid](cache, src, dst, cache.stride(0), cache.stride(1), numel, BLOCK=block)
