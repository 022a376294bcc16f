"""The Model contract: what the engine and the worker may know about a model.

A model is a part like the allocator or the sampler. The worker calls it; nothing outside a
model file looks inside one. It answers three things:

    spec: ModelSpec                         the numbers the KV cache, the attention backend,
                                            the sampler and the scheduler need
    forward(input_ids [T], positions [T], attention) -> hidden [T, D]
                                            one flattened ragged batch; `attention` is the
                                            step's AttentionBackend, planned with the batch's
                                            PagedKVLayout and holding the paged KV cache
    compute_logits(hidden [N, D]) -> float32 logits [N, V]
                                            (None on ranks other than 0 of a tensor-parallel group)
    load_weights(iterable of (checkpoint name, tensor)) -> set of (parameter, shard) written
                                            every layer places its own part (merged projections,
                                            its tensor-parallel rank's slice, quantized forms)

The batch travels as the attention backend's plan rather than as an argument: the backend
owns the page table and the cache, and the model only hands it each layer's q, k and v
(`attention.write_kv(layer, k, v)`, `attention.run(layer, q)`). That keeps one forward for a
plain step, a replayed CUDA graph (a proxy backend) and a tensor-parallel rank.

Capabilities are declared, never probed: `ModelSpec.supports_*` fields say what the model
can do (today: tensor parallelism, the truncated draft of speculative decoding).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

ATTENTION_KINDS = ("full", "sliding", "none")


@dataclass(frozen=True)
class LayerAttention:
    """How one decoder layer attends. kind "full": every earlier token; "sliding": the last
    `window` tokens, itself included; "none": no attention (no KV cache for the layer)."""
    kind: str = "full"
    window: int | None = None
    soft_cap: float | None = None     # logits -> soft_cap * tanh(logits / soft_cap) (Gemma 2)
    scale: float | None = None        # None: head_dim ** -0.5
    causal: bool = True               # False: bidirectional (encoders): every token of the sequence

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {self.kind!r}")
        if (self.kind == "sliding") != (self.window is not None):
            raise ValueError(f"a 'sliding' layer needs window >= 1 and only it has one; got "
                             f"kind={self.kind!r}, window={self.window!r}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.soft_cap is not None and not self.soft_cap > 0:
            raise ValueError(f"soft_cap must be None or > 0, got {self.soft_cap}")


@dataclass(frozen=True)
class ModelSpec:
    """The numbers outside the model may read. Head counts are this rank's (a tensor-parallel
    rank holds num_heads / N query heads); vocab_size is the whole vocabulary."""
    architecture: str                 # the checkpoint's architectures[0], e.g. "Gemma2ForCausalLM"
    num_layers: int
    num_heads: int                    # query heads on this rank
    num_kv_heads: int                 # KV heads on this rank (the KV cache's)
    head_dim: int
    hidden_size: int
    vocab_size: int
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    layers: tuple[LayerAttention, ...] = ()   # one per decoder layer (empty: all "full")
    supports_tensor_parallel: bool = True
    supports_truncated_draft: bool = False    # speculative="draft", draft_model=N layers
    supports_generation: bool = True          # False: no LM head (an encoder): pooling only

    def __post_init__(self) -> None:
        if self.layers and len(self.layers) != self.num_layers:
            raise ValueError(f"ModelSpec.layers has {len(self.layers)} entries for "
                             f"{self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")

    def layer(self, i: int) -> LayerAttention:
        return self.layers[i] if self.layers else LayerAttention()

    def attention_groups(self) -> dict[LayerAttention, list[int]]:
        """Layers that attend alike (kind, window, soft cap, scale) -> their indices, in order."""
        groups: dict[LayerAttention, list[int]] = {}
        for i in range(self.num_layers):
            groups.setdefault(self.layer(i), []).append(i)
        return groups


@runtime_checkable
class Model(Protocol):
    spec: ModelSpec

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Any) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None: ...

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[tuple[str, int]]: ...


MODEL_METHODS = ("forward", "compute_logits", "load_weights")


def check_model(model: Any) -> ModelSpec:
    """The model's spec, or a ValueError naming what the Model contract misses."""
    missing = [m for m in MODEL_METHODS if not callable(getattr(model, m, None))]
    spec = getattr(model, "spec", None)
    if not isinstance(spec, ModelSpec):
        missing.append("spec (a toolkit.models.base.ModelSpec)")
    if missing:
        raise ValueError(f"model {type(model).__name__} lacks {missing}, which the Model contract "
                         "requires (toolkit/models/base.py)")
    return spec


def eos_ids(config: Any) -> tuple[int, ...]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def in_vocabulary(eos: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """The end-of-sequence ids inside [0, vocab_size). One outside (a config's default kept on
    a smaller vocabulary: OlmoeConfig's 50279) can never be sampled; it is dropped with a
    warning, as transformers only warns, instead of failing every request."""
    bad = [t for t in eos if not 0 <= t < vocab_size]
    if bad:
        logging.getLogger(__name__).warning(
            "the config's eos_token_id %s is outside the vocabulary [0, %d): ignored (generation "
            "stops at max_tokens and stop conditions only, unless another eos id is in range)",
            bad, vocab_size)
    return tuple(t for t in eos if 0 <= t < vocab_size)


def layer_kinds(config: Any, num_layers: int) -> Sequence[str]:
    """Each layer's attention kind from a Hugging Face config: `layer_types` when present
    ("full_attention" / "sliding_attention"), otherwise one kind for all layers."""
    types = getattr(config, "layer_types", None)
    if types:
        if len(types) != num_layers:
            raise ValueError(f"config.layer_types has {len(types)} entries for {num_layers} layers")
        out = []
        for t in types:
            if t not in ("full_attention", "sliding_attention"):
                raise ValueError(f"layer type {t!r} is not supported; supported: "
                                 "'full_attention', 'sliding_attention'")
            out.append("sliding" if t == "sliding_attention" else "full")
        return out
    window = getattr(config, "sliding_window", None)
    on = window is not None and getattr(config, "use_sliding_window", True) is not False
    return ["sliding" if on else "full"] * num_layers
