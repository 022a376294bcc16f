"""Pure-torch twins of the cache kernels: same names, same signatures.

They are the test oracle, the CPU path and the fallback of toolkit/kernels/*.py.
"""

from __future__ import annotations

from typing import Sequence

import torch


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V at their slots; slot -1 is skipped.

    k, v: [T, H_kv, D]; kv_cache: [2, num_blocks, block_size, H_kv, D]; slot_mapping: int [T].
    """
    _, nb, bs, h, d = kv_cache.shape
    flat = kv_cache.view(2, nb * bs, h, d)                       # [2, slots, H_kv, D]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    flat[0, slots] = k[keep].to(kv_cache.dtype)
    flat[1, slots] = v[keep].to(kv_cache.dtype)


def copy_blocks(kv_caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """For every layer, block dst[i] <- block src[i] (K and V): copy-on-write of shared blocks."""
    src, dst = src.long(), dst.long()
    for cache in kv_caches:                                       # [2, NB, BS, H_kv, D]
        cache[:, dst] = cache[:, src]
