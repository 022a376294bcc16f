"""truncated_model: the first layers of a toolkit Llama-family model as a draft model.

The draft shares every weight with the target (embedding, the first num_layers decoder
layers, the final norm, the LM head): no copy, no extra memory but its KV cache. Same
tokenizer by construction; acceptance is low but correct, which is what tests need.
"""

from __future__ import annotations

import copy

from torch import nn


def truncated_model(model: nn.Module, num_layers: int) -> nn.Module:
    """A view of `model` (toolkit.models.llama.LlamaForCausalLM) with its first num_layers layers."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model, "geometry"):
        raise ValueError(f"truncated_model needs a toolkit Llama-family model (model.model.layers, "
                         f"model.geometry), got {type(model).__name__}")
    if not (isinstance(num_layers, int) and 1 <= num_layers <= len(layers)):
        raise ValueError(f"num_layers must be in [1, {len(layers)}], got {num_layers!r}")
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)          # own module dict: the target keeps its layers
    inner.layers = nn.ModuleList(list(layers)[:num_layers])
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    draft.model = inner
    draft.geometry = copy.copy(model.geometry)
    draft.geometry.num_layers = num_layers
    return draft
