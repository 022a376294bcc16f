"""An activation already quantized per token: what a fused norm or activation hands a W8A8 layer.

A norm or GLU activation whose consumer is a W8A8 layer with dynamic per-token activations
writes (codes, scales) in one kernel (toolkit/kernels/fused_quant.py) instead of a dense tensor
the layer then reads back to quantize; `W8A8LinearMethod.apply` takes this carrier as its x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantizedActivation:
    q: torch.Tensor           # [T, K] float8_e4m3fn or int8 codes
    scale: torch.Tensor       # [T, 1] fp32, per token
    dtype: torch.dtype        # the dense activation's dtype (the layer's output dtype)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        """The dense [T, K] activation these codes stand for, in `dtype`."""
        return (self.q.float() * self.scale).to(self.dtype)

    def __repr__(self) -> str:
        return f"QuantizedActivation({tuple(self.q.shape)}, {self.q.dtype}, from {self.dtype})"
