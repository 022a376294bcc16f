"""The attention backend(s) of a model: one backend per way its layers attend.

A model's spec lists each layer's `LayerAttention` (full or a sliding window of W, a logit
soft cap, a scale). Layers that attend alike share one backend; a model whose layers all
attend alike (Llama, Qwen) gets that backend itself, unwrapped. Interleaved local and
global layers (Gemma 2 and 3) get a `LayerwiseAttention` over two backends that share the
one paged KV cache: plan() plans each once per step (their tile schedules differ, because
the window bounds which keys a tile reads), and each layer's calls go to its own backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from toolkit.models.base import LayerAttention, ModelSpec


def backend_kwargs(spec: ModelSpec, kind: LayerAttention) -> dict[str, Any]:
    """The keyword arguments an AttentionBackend is built with for layers of this kind."""
    if kind.kind == "none":
        raise ValueError("layers without attention need no backend")
    kw = dict(num_heads=spec.num_heads, head_dim=spec.head_dim,
              scale=kind.scale if kind.scale is not None else spec.head_dim ** -0.5,
              sliding_window=kind.window, soft_cap=kind.soft_cap)
    if not kind.causal:                   # only then: a backend without the argument stays usable
        kw["causal"] = False
    return kw


def build_attention(spec: ModelSpec, make: Callable[..., Any]) -> Any:
    """The model's attention: make(**backend_kwargs) builds one backend (over the KV cache)."""
    groups = {kind: layers for kind, layers in spec.attention_groups().items() if kind.kind != "none"}
    backends = {kind: make(**backend_kwargs(spec, kind)) for kind in groups}
    if len(backends) == 1:
        return next(iter(backends.values()))
    by_layer = [None] * spec.num_layers
    for kind, layers in groups.items():
        for i in layers:
            by_layer[i] = backends[kind]
    return LayerwiseAttention(list(backends.values()), by_layer)


class LayerwiseAttention:
    """Backends over one KV cache, each serving some of the layers (module doc)."""

    def __init__(self, backends: list[Any], by_layer: list[Any]) -> None:
        self.backends, self.by_layer = backends, by_layer
        first = backends[0]
        self.kv_cache = first.kv_cache
        self.num_heads, self.num_kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        # declared capabilities hold when every backend has them; whole-forward decode graphs
        # (supports_static_decode) are not offered yet: steps replay the piecewise graphs
        for cap in ("supports_run_out", "supports_fused_kv_write"):
            setattr(self, cap, all(getattr(b, cap, False) for b in backends))
        self.supports_static_decode = False

    def _of(self, layer: int) -> Any:
        b = self.by_layer[layer]
        if b is None:
            raise ValueError(f"layer {layer} has no attention")
        return b

    def plan(self, layout: Any) -> None:
        for b in self.backends:
            b.plan(layout)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._of(layer).write_kv(layer, k, v)

    def kv_target(self, layer: int, v: torch.Tensor) -> Any:
        return self._of(layer).kv_target(layer, v)

    def kv_written(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._of(layer).kv_written(layer, k, v)

    def run(self, layer: int, q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            return self._of(layer).run(layer, q)
        return self._of(layer).run(layer, q, out=out)

    def warm_up(self, dtype: torch.dtype) -> None:
        for b in self.backends:
            if callable(getattr(b, "warm_up", None)):
                b.warm_up(dtype)

    def __repr__(self) -> str:
        counts = [sum(b is x for b in self.by_layer) for x in self.backends]
        return "LayerwiseAttention(" + ", ".join(f"{n} layers: {b!r}" for n, b in zip(counts, self.backends)) + ")"
