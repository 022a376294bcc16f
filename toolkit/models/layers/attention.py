"""The attention layer: rotary (optionally after a per-head norm), the KV write and the
backend's attention over the paged cache, for one decoder layer.

What makes layers attend differently (a sliding window, logit soft-capping, the scale) is
the layer's `LayerAttention` in the model's spec; the engine builds the attention backend(s)
from the spec (toolkit/attention/layerwise.py), so the layer hands the backend only its
index, q, k and v. A backend that declares `supports_fused_kv_write` hands out the layer's
cache slots (`kv_target`) and the rotary launch stores K/V there itself (one launch fewer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.base import LayerAttention
from toolkit.models.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, layer: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 kind: LayerAttention, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.layer, self.kind, self.rotary = layer, kind, rotary
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                backend: Any, norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
        """q [T, H*D], k, v [T, Hkv*D] (views of the QKV projection) -> [T, H*D].
        norm: (q weight [D], k weight [D], eps) of an RMSNorm over each head before rotary."""
        t, h, h_kv, d = q.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = q.view(t, h, d), k.view(t, h_kv, d), v.reshape(t, h_kv, d)
        # rotate out of place into contiguous q [T, H, D], k [T, Hkv, D]
        fresh = torch.contiguous_format
        out = (torch.empty_like(q, memory_format=fresh), torch.empty_like(k, memory_format=fresh))
        fused = self.rotary.fuses_kv_write and getattr(backend, "supports_fused_kv_write", False)
        kv = backend.kv_target(self.layer, v) if fused else None
        q, k = self.rotary(positions, q, k, out=out, kv=kv, norm=norm)
        if kv is None:
            backend.write_kv(self.layer, k, v)
        else:
            backend.kv_written(self.layer, k, v)
        return backend.run(self.layer, q).reshape(t, h * d)          # [T, H*D]

    def extra_repr(self) -> str:
        return (f"layer={self.layer}, heads={self.num_heads}/{self.num_kv_heads} x {self.head_dim}, "
                f"{self.kind}")
