"""Rotary position embedding: frequencies read from a Hugging Face config, and the layer.

Rope types "default", "linear" and "llama3" (Llama 3.1+ frequency-dependent scaling) are
computed here exactly as transformers computes them; "yarn" (and any other static type
transformers knows) through transformers' own `ROPE_INIT_FUNCTIONS`, which also gives the
attention factor that scales cos and sin. "dynamic" and "longrope" are refused: their
frequencies change with the sequence's length at run time, which one cos|sin table per
position cannot hold. Parameters come from `config.rope_parameters` (transformers >= 5; a
dict per layer type for models whose local and global layers rotate differently, as
Gemma 3's) or `rope_theta` + `rope_scaling` (earlier versions). Partial rotary
(`partial_rotary_factor` < 1) rotates the first rotary_dim features of each head.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from toolkit.kernels.reference_model import KVWrite

OWN_ROPE_TYPES = ("default", "linear", "llama3")
REFUSED_ROPE_TYPES = ("dynamic", "longrope")


def rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """One flat dict with rope_theta, rope_type and the scaling fields, whatever the config
    version; layer_type picks the entry of a per-layer-type rope_parameters."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    elif params and all(isinstance(v, dict) for v in params.values()):
        params = dict(params.get("full_attention") or next(iter(params.values())))
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict) and "rope_theta" not in scaling:
        params = {**scaling, **params}
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = getattr(config, "partial_rotary_factor", None) or 1.0
    return params


def rotary_dim(config: Any, head_dim: int, layer_type: str | None = None) -> int:
    dim = int(head_dim * rope_parameters(config, layer_type)["partial_rotary_factor"])
    if dim % 2 or not 0 < dim <= head_dim:
        raise ValueError(f"partial_rotary_factor gives {dim} rotated features of a {head_dim}-wide "
                         "head; it must be even and at most the head size")
    return dim


def inv_frequencies(config: Any, head_dim: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(fp32 [rotary_dim / 2]: the angle per position of each rotated pair, the factor that
    scales cos and sin)."""
    p = rope_parameters(config, layer_type)
    kind = p["rope_type"]
    dim = rotary_dim(config, head_dim, layer_type)
    if kind in REFUSED_ROPE_TYPES:
        raise ValueError(f"rope_type {kind!r} is not supported (its frequencies depend on the "
                         f"sequence length at run time); supported: {OWN_ROPE_TYPES} and yarn")
    if kind not in OWN_ROPE_TYPES:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if kind not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"rope_type {kind!r} is not supported; supported: {OWN_ROPE_TYPES} "
                             f"and {sorted(set(ROPE_INIT_FUNCTIONS) - set(REFUSED_ROPE_TYPES))}")
        kw = {"layer_type": layer_type} if layer_type is not None else {}
        inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"), **kw)
        return inv_freq.float(), float(factor)
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (p["rope_theta"] ** exponent)
    if kind == "linear":
        return inv_freq / p["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, p), 1.0
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    # long wavelengths are divided by `factor`, short ones kept, the band between interpolated
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(inv_freq: torch.Tensor, max_positions: int, device: torch.device | str,
                  scale: float = 1.0) -> torch.Tensor:
    """fp32 [max_positions, rotary_dim]: row p = cos(p * inv_freq) | sin(p * inv_freq), times scale."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2], one fp32 product as HF
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return (cache * scale if scale != 1.0 else cache).to(device)


class RotaryEmbedding:
    """Rotates q [T, H, D] and k [T, Hkv, D] at their positions (neox style: the halves of the
    first rotary_dim features), optionally after an RMSNorm over each head (Qwen3, Gemma 3),
    and, when the backend hands out its cache slots (`kv`), stores k and v there in the same
    launch. `fuses_kv_write`: whether it can (whole-head rotary: the ops' kernels)."""

    def __init__(self, config: Any, head_dim: int, max_positions: int, device: torch.device | str,
                 ops: Any, layer_type: str | None = None) -> None:
        inv_freq, scale = inv_frequencies(config, head_dim, layer_type)
        self.head_dim, self.rotary_dim, self.ops = head_dim, 2 * inv_freq.shape[0], ops
        self.cache = cos_sin_cache(inv_freq, max_positions, device, scale)   # fp32 [P, rotary_dim]
        self.fuses_kv_write = self.rotary_dim == head_dim

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, *,
                 out: tuple[torch.Tensor, torch.Tensor], kv: KVWrite | None = None,
                 norm: tuple[torch.Tensor, torch.Tensor, float] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fuses_kv_write:
            if norm is not None:
                return self.ops.qk_norm_rotary(positions, q, k, self.cache, *norm, out=out, kv=kv)
            return self.ops.rotary(positions, q, k, self.cache, out=out, kv=kv)
        if kv is not None:
            raise ValueError("partial rotary does not write the KV cache; call write_kv")
        if norm is not None:
            q, _ = self.ops.rms_norm(q, norm[0], norm[2])
            k, _ = self.ops.rms_norm(k, norm[1], norm[2])
        # the first rotary_dim features rotate (contiguous copies: the kernels' layout), the
        # rest pass through
        r = self.rotary_dim
        q_rot, k_rot = q[..., :r].contiguous(), k[..., :r].contiguous()     # [T, H, r], [T, Hkv, r]
        self.ops.rotary(positions, q_rot, k_rot, self.cache)                 # in place
        q_out, k_out = out
        q_out[..., :r], q_out[..., r:] = q_rot, q[..., r:]
        k_out[..., :r], k_out[..., r:] = k_rot, k[..., r:]
        return q_out, k_out
