"""The attention function the Transformers backend registers with transformers ("toolkit").

transformers' attention modules call `attention_interface(module, q, k, v, mask, scaling=...,
**kwargs)` with q/k/v in its layout [B, H, T, D], rotary already applied, and expect
(out [B, T, H, D], weights or None). Here B is 1 (the step's ragged batch flattened into one
sequence of T tokens); this function writes K/V into the paged cache and asks the step's
AttentionBackend for the output. The backend travels in the forward's kwargs
(`toolkit_step=StepContext(...)`), which transformers passes through to every attention
call, so nothing is global: two models (or two engines) can run side by side.

Registering the name with transformers (`register_toolkit_attention`) touches transformers'
own registry of attention functions; it is done when a backend model is built, never at
import, and is idempotent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolkit.models.base import LayerAttention

ATTN_IMPLEMENTATION = "toolkit"
CONTEXT_KWARG = "toolkit_step"
# attention-call kwargs of features the toolkit's backends lack -> what they are
UNSUPPORTED_KWARGS = {"s_aux": "attention sinks (gpt-oss)"}


@dataclass(frozen=True)
class StepContext:
    """What one forward's attention calls need: the step's backend (planned with the batch's
    PagedKVLayout) and how each layer must attend (the model's spec.layers)."""
    backend: Any
    layers: Sequence[LayerAttention]


def register_toolkit_attention() -> None:
    """Make attn_implementation="toolkit" known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, toolkit_attention_forward)


def toolkit_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> (out [1, T, H, D], None).

    attention_mask is ignored: the paged layout the backend was planned with is the mask
    (causal within each sequence of the flattened batch, plus the layer's window)."""
    step = kwargs.get(CONTEXT_KWARG)
    if not isinstance(step, StepContext):
        raise ValueError(
            f"{type(module).__name__} called the toolkit attention function without a "
            f"{CONTEXT_KWARG}= StepContext; its model must be run through "
            "TransformersForCausalLM.forward, and its decoder must pass **kwargs on to the attention"
        )
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int) or not 0 <= layer < len(step.layers):
        raise ValueError(f"{type(module).__name__}.layer_idx is {layer!r}; the toolkit attention "
                         f"needs a decoder layer index in [0, {len(step.layers)})")
    if query.shape[0] != 1:
        raise ValueError(f"the toolkit attention runs one flattened batch [1, H, T, D], got "
                         f"query {tuple(query.shape)}")
    if dropout:
        raise ValueError(f"attention dropout {dropout} is a training feature; call model.eval()")
    _check_layer(layer, step.layers[layer], scaling, query.shape[-1], kwargs)
    # [1, H, T, D] -> [T, H, D]; contiguous, as the backends index rows of T
    q = query[0].transpose(0, 1).contiguous()
    k = key[0].transpose(0, 1).contiguous()
    v = value[0].transpose(0, 1).contiguous()
    step.backend.write_kv(layer, k, v)
    out = step.backend.run(layer, q)                                   # [T, H, D]
    return out.unsqueeze(0), None                                      # [1, T, H, D]


def _check_layer(layer: int, spec: LayerAttention, scaling: float | None, head_dim: int,
                 kwargs: dict[str, Any]) -> None:
    """What transformers asks of this call must be what spec.layers promised the engine (the
    engine built the layer's backend from the spec), or outputs would silently differ. A
    family leaves out what it does not use (no `softcap` kwarg: no soft cap)."""
    asked: dict[str, tuple[Any, Any]] = {}
    if scaling is not None:
        asked["scale"] = (scaling, spec.scale if spec.scale is not None else head_dim ** -0.5)
    if "sliding_window" in kwargs:
        asked["sliding_window"] = (kwargs["sliding_window"], spec.window)
    if "softcap" in kwargs:
        asked["soft_cap"] = (kwargs["softcap"], spec.soft_cap)
    for name, (got, want) in asked.items():
        same = got is None and want is None or (
            got is not None and want is not None and math.isclose(float(got), float(want), rel_tol=1e-6))
        if not same:
            raise ValueError(f"layer {layer}: transformers asks for {name}={got!r} but the model's "
                             f"spec.layers[{layer}] says {want!r}; the toolkit backend would "
                             "attend differently from the checkpoint's model")
    for name, what in UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"layer {layer}: the attention call passes {name!r} ({what}), which "
                             "the toolkit backends do not implement")
