"""Gated (GLU) activations over a merged gate | up projection: x [T, 2I] -> [T, I]."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_tanh", "gelu")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU with the tanh approximation (Gemma): gelu_tanh(x[..., :I]) * x[..., I:]."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate) * up


def glu(name: str, ops: Any):
    """The GLU function of a Hugging Face activation name (SiLU: the ops' kernel)."""
    if name == "silu":
        return ops.silu_and_mul
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return gelu_tanh_and_mul
    if name == "gelu":
        return gelu_and_mul
    raise ValueError(f"activation {name!r} is not supported; supported: {ACTIVATIONS}")
