"""Normalisations: RMSNorm (fused with the residual add), Gemma's RMSNorm and LayerNorm.

`RMSNorm(x, residual)` returns (norm(x + residual), x + residual), one kernel on CUDA, so a
decoder layer carries its residual stream without a separate add. Gemma's checkpoints store
w with the norm scaling by (1 + w): its loader stores 1 + w (computed in float32, then the
model's dtype), so the same kernel runs it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.models.layers.linear import mark, vector
from toolkit.models.layers.parallel import shape_of, take


def copy_whole(param: nn.Parameter, loaded: Any, what: str, offset: float = 0.0) -> None:
    """A norm's checkpoint tensor, whole on every rank (+ offset, in float32)."""
    if shape_of(loaded) != tuple(param.shape):
        raise ValueError(f"shape mismatch for {what}: checkpoint has {shape_of(loaded)}, the "
                         f"model expects {tuple(param.shape)}")
    value = take(loaded)
    param.data.copy_(value.float() + offset if offset else value)


class RMSNorm(nn.Module):
    init = "ones"

    def __init__(self, n: int, eps: float, *, ops: Any, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps, self.ops = eps, ops
        self.weight = mark(vector(n, dtype, torch.device(device)), self.weight_loader, [(None, (n,))],
                           self.init)
        # ops.rms_norm's signature returning (a QuantizedActivation, the new residual): set when
        # this norm's consumer is a W8A8 layer (quantization/fusion.py); None: dense output
        self.quant_out: Any = None

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_whole(param, loaded, "a norm")

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, n] (+ residual [T, n]) -> (normed [T, n], the new residual [T, n])."""
        if self.quant_out is not None:
            return self.quant_out(x, self.weight, self.eps, residual)
        return self.ops.rms_norm(x, self.weight, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) * (1 + w): the checkpoint's w is stored as 1 + w. Random weights draw the
    checkpoint's w = 0 (a scale of 1), as Gemma initialises them."""
    init = "zeros"

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_whole(param, loaded, "a norm", offset=1.0)


class LayerNorm(nn.Module):
    """torch's layer norm over the last dimension, with the residual add RMSNorm has."""
    init = "ones"

    def __init__(self, n: int, eps: float, *, bias: bool = True, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        dev = torch.device(device)
        self.weight = mark(vector(n, dtype, dev), self._load, [(None, (n,))], "ones")
        self.bias = mark(vector(n, dtype, dev), self._load, [(None, (n,))], "zeros") if bias else None

    def _load(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_whole(param, loaded, "a layer norm")

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps), x
