"""Pure-torch twins of the cache kernels: same names, same signatures.

They are the test oracle, the CPU path and the fallback of toolkit/kernels/*.py.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0          # largest finite e4m3fn value; larger magnitudes saturate to it


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """e4m3fn(x / scale): divided in float32, saturated to +-448, rounded to nearest even
    (NaN stays NaN). The stored value times `scale` approximates x."""
    s = torch.tensor(scale, dtype=torch.float32, device=x.device)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(cache: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 view of cache values: an fp8 cache's values times its scale, others as they are."""
    if cache.dtype == FP8_DTYPE:
        return cache.float() * torch.tensor(scale, dtype=torch.float32, device=cache.device)
    return cache.float()


def check_write_kv_args(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must both be [T, H_kv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or kv_cache.shape[3:] != k.shape[1:]:
        raise ValueError(f"kv_cache must be [2, num_blocks, block_size, {k.shape[1]}, {k.shape[2]}], "
                         f"got {tuple(kv_cache.shape)}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype.is_floating_point:
        raise ValueError(f"slot_mapping must be an integer tensor [T={k.shape[0]}], got "
                         f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}")


def check_scales(kv_cache: torch.Tensor, k_scale: float, v_scale: float) -> None:
    if kv_cache.dtype == FP8_DTYPE:
        if not (k_scale > 0 and v_scale > 0) or not math.isfinite(k_scale * v_scale):
            raise ValueError(f"an fp8 KV cache needs finite scales > 0, got k_scale={k_scale}, "
                             f"v_scale={v_scale}")
    elif (k_scale, v_scale) != (1.0, 1.0):
        raise ValueError(f"k_scale/v_scale apply to a float8_e4m3fn cache only; this cache is "
                         f"{kv_cache.dtype} (got k_scale={k_scale}, v_scale={v_scale})")


def fuses_merge(part_out: torch.Tensor | None, merge_rows: torch.Tensor | None,
                counters: torch.Tensor | None, num_kv_heads: int) -> bool:
    """Whether a paged-attention launch also merges its split partials (part_out and
    merge_rows given); then counters must be int32 with a slot per (merge row, KV head)."""
    if part_out is None or merge_rows is None:
        return False
    if merge_rows.dtype != torch.int32 or merge_rows.dim() != 2 or merge_rows.shape[1] != 2 \
            or not merge_rows.is_contiguous():
        raise ValueError(f"merge_rows must be contiguous int32 [R, 2] (output token, splits), got "
                         f"{merge_rows.dtype} {tuple(merge_rows.shape)}")
    need = merge_rows.shape[0] * num_kv_heads
    if counters is None or counters.dtype != torch.int32 or counters.numel() < need:
        got = None if counters is None else f"{counters.dtype} x {counters.numel()}"
        raise ValueError(f"a fused merge needs int32 counters, at least merge rows x KV heads = "
                         f"{need} of them, got {got}")
    return True


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Store this step's K/V at their slots; slot -1 is skipped. An fp8 cache stores
    quantize_fp8(k, k_scale) and quantize_fp8(v, v_scale).

    k, v: [T, H_kv, D]; kv_cache: [2, num_blocks, block_size, H_kv, D]; slot_mapping: int [T].
    """
    check_scales(kv_cache, k_scale, v_scale)
    _, nb, bs, h, d = kv_cache.shape
    flat = kv_cache.view(2, nb * bs, h, d)                       # [2, slots, H_kv, D]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if kv_cache.dtype == FP8_DTYPE:
        flat[0, slots] = quantize_fp8(k[keep], k_scale)
        flat[1, slots] = quantize_fp8(v[keep], v_scale)
        return
    flat[0, slots] = k[keep].to(kv_cache.dtype)
    flat[1, slots] = v[keep].to(kv_cache.dtype)


def copy_blocks(kv_caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """For every layer, block dst[i] <- block src[i] (K and V): copy-on-write of shared blocks."""
    src, dst = src.long(), dst.long()
    for cache in kv_caches:                                       # [2, NB, BS, H_kv, D]
        cache[:, dst] = cache[:, src]
