"""Pick an implementation of the cache ops: Triton on CUDA tensors, the torch twin otherwise.

backend="auto" decides from the tensor's device; "triton" or "torch" forces one (tests force
Triton on the CPU under TRITON_INTERPRET=1). Triton modules are imported only when used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolkit.kernels import reference

BACKENDS = ("auto", "triton", "torch")


def use_triton(t: torch.Tensor, backend: str) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; valid: {BACKENDS}")
    return t.is_cuda if backend == "auto" else backend == "triton"


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0, *, backend: str = "auto") -> None:
    """k, v: [T, H_kv, D] into kv_cache [2, NB, BS, H_kv, D] at slot_mapping [T] (-1 = skip);
    an fp8 cache stores e4m3(k / k_scale), e4m3(v / v_scale)."""
    if use_triton(kv_cache, backend):
        from toolkit.kernels.write_kv import write_kv as fast
        fast(k, v, kv_cache, slot_mapping, k_scale, v_scale)
    else:
        reference.write_kv(k, v, kv_cache, slot_mapping, k_scale, v_scale)


def copy_blocks(kv_caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
                *, backend: str = "auto") -> None:
    """Every layer: block dst[i] <- block src[i] (K and V)."""
    if not kv_caches:
        return
    if use_triton(kv_caches[0], backend):
        from toolkit.kernels.copy_blocks import copy_blocks as fast
        fast(kv_caches, src, dst)
    else:
        reference.copy_blocks(kv_caches, src, dst)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                *, backend: str = "auto") -> torch.Tensor:
    """out [T, R] = A[indices[t]] @ x[t] per token (-1: 0); kernels/lora_shrink.py."""
    if use_triton(x, backend):
        from toolkit.kernels.lora_shrink import lora_shrink as fast
        return fast(x, a, indices, out)
    from toolkit.kernels.reference_lora import lora_shrink as ref
    return ref(x, a, indices, out)


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, indices: torch.Tensor,
                slices: Sequence[tuple[int, int, int]], scale: float = 1.0, *, backend: str = "auto") -> torch.Tensor:
    """y[:, o:o+n] += scale * B[indices[t], o:o+n] @ h[t, ho:ho+R] per slice; kernels/lora_expand.py."""
    if use_triton(y, backend):
        from toolkit.kernels.lora_expand import lora_expand as fast
        return fast(y, h, b, indices, slices, scale)
    from toolkit.kernels.reference_lora import lora_expand as ref
    return ref(y, h, b, indices, slices, scale)
