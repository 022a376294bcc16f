"""Checks shared by every attention backend (run before any launch)."""

from __future__ import annotations

import torch

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout


def check_geometry(kv_cache: KVCache, num_heads: int, head_dim: int) -> None:
    if num_heads < 1 or num_heads % kv_cache.num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of the cache's "
                         f"num_kv_heads ({kv_cache.num_kv_heads})")
    if head_dim != kv_cache.head_dim:
        raise ValueError(f"head_dim {head_dim} differs from the cache's head_dim {kv_cache.head_dim}")


def check_layout(layout: PagedKVLayout, kv_cache: KVCache) -> None:
    if layout.block_size != kv_cache.block_size:
        raise ValueError(f"layout.block_size {layout.block_size} differs from the cache's "
                         f"block_size {kv_cache.block_size}")
    idx = layout.host.kv_indices      # the CPU copy: no device->host sync
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= kv_cache.num_blocks):
        raise ValueError(f"block table points outside the cache: ids must be in [0, "
                         f"{kv_cache.num_blocks}), got [{int(idx.min())}, {int(idx.max())}]")


def check_qkv(q: torch.Tensor | None, k: torch.Tensor | None, kv_cache: torch.Tensor,
              num_heads: int, num_tokens: int) -> None:
    _, _, _, h_kv, d = kv_cache.shape
    if q is not None and (q.dim() != 3 or q.shape[1:] != (num_heads, d) or q.shape[0] != num_tokens):
        raise ValueError(f"q must be [T={num_tokens}, H={num_heads}, D={d}], got {tuple(q.shape)}")
    if k is not None and (k.dim() != 3 or k.shape[1:] != (h_kv, d) or k.shape[0] != num_tokens):
        raise ValueError(f"k/v must be [T={num_tokens}, H_kv={h_kv}, D={d}], got {tuple(k.shape)}")
    t = q if q is not None else k
    # an fp8 cache takes q/k/v of the model's dtype (written quantised, read dequantised)
    if t is not None and t.dtype != kv_cache.dtype and not (
            kv_cache.dtype == torch.float8_e4m3fn and t.dtype.is_floating_point):
        raise ValueError(f"dtype {t.dtype} differs from the KV cache's {kv_cache.dtype}")
