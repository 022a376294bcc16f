"""Which implementation of the model's elementwise ops runs: Triton on CUDA, the torch twins elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelOps:
    rms_norm: Callable[
        ..., tuple[torch.Tensor, torch.Tensor]
    ]  # (x, weight, eps, residual) -> (normed, residual)
    rotary: Callable[
        ..., tuple[torch.Tensor, torch.Tensor]
    ]  # (positions, q, k, cos_sin_cache) -> (q, k)
    silu_and_mul: Callable[..., torch.Tensor]  # x [T, 2I] -> [T, I]


def model_ops(device: torch.device | str) -> ModelOps:
    """The Triton kernels for a CUDA device; the pure-torch twins (the reference path) otherwise."""
    if torch.device(device).type == "cuda":
        from toolkit.kernels.rms_norm import rms_norm
        from toolkit.kernels.rotary import rotary
        from toolkit.kernels.silu_and_mul import silu_and_mul
    else:
        from toolkit.kernels.reference_model import rms_norm, rotary, silu_and_mul
    return ModelOps(rms_norm=rms_norm, rotary=rotary, silu_and_mul=silu_and_mul)
