"""The ModelSpec of a transformers model: geometry from its config, each layer's attention
(scale, sliding window, soft cap) from its attention modules, and its logit transform.

The modules are read rather than the config alone because families keep these in different
places (Granite's scale is `config.attention_multiplier`, Gemma 2's window is per layer);
what a module stores is what it passes to the attention function, which checks it again on
every call (transformers/attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from toolkit.models.base import LayerAttention, ModelSpec, eos_ids, in_vocabulary, layer_kinds


def attention_modules(hf: torch.nn.Module, num_layers: int) -> list[torch.nn.Module]:
    """The self-attention module of each decoder layer, in layer order: the modules whose class
    name ends in "Attention" and that carry an integer layer_idx (what transformers'
    attention function receives)."""
    found: dict[int, torch.nn.Module] = {}
    for _, mod in hf.named_modules():
        idx = getattr(mod, "layer_idx", None)
        if type(mod).__name__.endswith("Attention") and isinstance(idx, int):
            if idx in found:
                raise ValueError(f"{type(hf).__name__} has two attention modules with layer_idx "
                                 f"{idx}; the Transformers backend needs one per decoder layer")
            found[idx] = mod
    missing = sorted(set(range(num_layers)) - set(found))
    if missing or len(found) != num_layers:
        raise ValueError(f"{type(hf).__name__}: decoder layers {missing} have no attention module "
                         f"(recurrent, convolutional or state-space layers?); the Transformers "
                         f"backend runs models whose every one of the {num_layers} layers attends "
                         "through the attention interface, as a flattened batch has no other "
                         "per-sequence state")
    return [found[i] for i in range(num_layers)]


def _head_dim(config: Any, module: torch.nn.Module) -> int:
    for name in ("head_dim", "head_size"):
        v = getattr(module, name, None)
        if isinstance(v, int):
            return v
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def layer_attention(config: Any, modules: list[torch.nn.Module]) -> tuple[LayerAttention, ...]:
    """Each layer's kind / window / soft cap / scale. With `config.layer_types` the kind is
    the config's (Exaone 4 keeps the window on every module and uses it on sliding layers
    only); without, a module's own `sliding_window` wins over the config's (Gemma 2 sets it
    per layer, None on full layers)."""
    kinds = layer_kinds(config, len(modules))
    config_window = getattr(config, "sliding_window", None)
    per_layer_types = bool(getattr(config, "layer_types", None))
    out = []
    for mod, kind in zip(modules, kinds):
        window = getattr(mod, "sliding_window", None) if hasattr(mod, "sliding_window") else (
            config_window if kind == "sliding" else None)
        if per_layer_types:
            window = (window or config_window) if kind == "sliding" else None
        soft_cap = getattr(mod, "attn_logit_softcapping", getattr(config, "attn_logit_softcapping", None))
        scale = getattr(mod, "scaling", None)
        out.append(LayerAttention(
            kind="sliding" if window is not None else "full",
            window=None if window is None else int(window),
            soft_cap=None if soft_cap is None else float(soft_cap),
            scale=float(scale) if scale is not None else _head_dim(config, mod) ** -0.5,
        ))
    return tuple(out)


def model_spec(config: Any, hf: torch.nn.Module, dtype: torch.dtype,
               eos_token_ids: list[int] | None) -> ModelSpec:
    n = int(config.num_hidden_layers)
    layer_kinds(config, n)            # refuses layer types other than full / sliding attention
    modules = attention_modules(hf, n)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    archs = getattr(config, "architectures", None) or [type(hf).__name__]
    return ModelSpec(
        architecture=archs[0],
        num_layers=n,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(config, modules[0]),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        dtype=dtype,
        max_model_len=int(getattr(config, "max_position_embeddings", None) or 2048),
        eos_token_ids=in_vocabulary(eos_token_ids if eos_token_ids is not None else eos_ids(config),
                                    int(config.vocab_size)),
        layers=layer_attention(config, modules),
        supports_tensor_parallel=False,   # transformers' modules hold whole weights
    )


@dataclass(frozen=True)
class LogitTransform:
    """What a family's CausalLM forward does to lm_head's output, read from its config:
    x multiplier (Cohere's logit_scale, output_multiplier), / divisor (Granite's
    logits_scaling), then soft cap (Gemma 2's final_logit_softcapping)."""
    multiplier: float = 1.0
    soft_cap: float | None = None

    @classmethod
    def from_config(cls, config: Any) -> LogitTransform:
        mult = 1.0
        for name in ("logit_scale", "output_multiplier"):
            v = getattr(config, name, None)
            if v is not None:
                mult *= float(v)
        div = getattr(config, "logits_scaling", None)
        if div is not None:
            mult /= float(div)
        cap = getattr(config, "final_logit_softcapping", None)
        return cls(multiplier=mult, soft_cap=None if cap is None else float(cap))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, V] -> [N, V], in place."""
        if self.multiplier != 1.0:
            logits.mul_(self.multiplier)
        if self.soft_cap is not None:
            logits.div_(self.soft_cap).tanh_().mul_(self.soft_cap)
        return logits
