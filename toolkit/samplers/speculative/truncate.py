"""truncated_model: the first layers of a model as a draft model.

The draft shares every weight with the target (embedding, the first num_layers decoder
layers, the final norm, the LM head): no copy, no extra memory but its KV cache. Same
tokenizer by construction; acceptance is low but correct, which is what tests need. A model
offers it by declaring `spec.supports_truncated_draft` and taking `layers=N` in forward.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from toolkit.models.base import check_model


class TruncatedModel:
    """The Model contract over the target's first num_layers layers."""

    def __init__(self, target: Any, num_layers: int) -> None:
        spec = target.spec
        self.target, self.num_layers = target, num_layers
        self.spec = dataclasses.replace(spec, num_layers=num_layers,
                                        layers=spec.layers[:num_layers] if spec.layers else ())
        self.device = getattr(target, "device", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        return self.target.forward(input_ids, positions, attention, layers=self.num_layers)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.target.compute_logits(hidden, out=out)

    def load_weights(self, weights: Any) -> set[tuple[str, int]]:
        raise ValueError("a truncated draft shares the target's weights; load them into the target")

    def parameters(self):
        return self.target.parameters()

    def __repr__(self) -> str:
        return f"TruncatedModel({type(self.target).__name__}, first {self.num_layers} of {self.target.spec.num_layers} layers)"


def truncated_model(model: Any, num_layers: int) -> TruncatedModel:
    """A view of `model` with its first num_layers layers (a model whose spec declares
    supports_truncated_draft)."""
    spec = check_model(model)
    if not spec.supports_truncated_draft:
        raise ValueError(f"{type(model).__name__} does not declare supports_truncated_draft; give "
                         "draft_model= a folder, a config or a loaded model instead of a layer count")
    if not (isinstance(num_layers, int) and 1 <= num_layers <= spec.num_layers):
        raise ValueError(f"num_layers must be in [1, {spec.num_layers}], got {num_layers!r}")
    return TruncatedModel(model, num_layers)
