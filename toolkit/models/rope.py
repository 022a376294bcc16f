"""Rotary frequencies of a Hugging Face config, and the cos|sin cache the rotary kernel reads.

Supports rope types "default", "linear" and "llama3" (Llama 3.1+ frequency-dependent
scaling), read from `config.rope_parameters` (transformers >= 5) or `rope_theta` +
`rope_scaling` (earlier versions). Computed exactly as transformers does, so positions
rotate identically.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(config: Any) -> dict[str, Any]:
    """One flat dict with rope_theta, rope_type and the scaling fields, whatever the config version."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict) and "rope_theta" not in scaling:
        params = {**scaling, **params}
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def inv_frequencies(config: Any, head_dim: int) -> torch.Tensor:
    """fp32 [head_dim / 2]: the angle per position of each rotated pair."""
    p = rope_parameters(config)
    kind = p["rope_type"]
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type {kind!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"partial_rotary_factor must be 1.0 (rotary over the whole head), "
            f"got {p['partial_rotary_factor']}"
        )
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (p["rope_theta"] ** exponent)
    if kind == "linear":
        return inv_freq / p["factor"]
    if kind == "llama3":
        return _llama3(inv_freq, p)
    return inv_freq


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


def cos_sin_cache(
    inv_freq: torch.Tensor, max_positions: int, device: torch.device | str
) -> torch.Tensor:
    """fp32 [max_positions, D]: row p = cos(p * inv_freq) | sin(p * inv_freq)."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2], one fp32 product as HF
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
