"""The Transformers backend: any causal LM transformers implements, on the toolkit's paged KV
cache, scheduler and samplers (vLLM's model_impl="transformers" design).

transformers builds the model with attn_implementation="toolkit"; every attention module then
calls toolkit_attention_forward (transformers/attention.py), which writes the layer's K/V
into the paged cache and returns the step's AttentionBackend output. Everything else (norms,
MLPs, rotary variants, embeddings) is transformers' own code, so a family the toolkit has
no model file for runs unchanged. The batch is one flattened sequence [1, T] with the
engine's positions as position_ids and no transformers KV cache.

Families whose attention does not go through transformers' attention-function interface
(`_supports_attention_backend` False, e.g. StableLM, Falcon, Bloom) are refused by name.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from toolkit.models.base import ModelSpec
from toolkit.models.transformers.attention import (
    ATTN_IMPLEMENTATION,
    CONTEXT_KWARG,
    StepContext,
    register_toolkit_attention,
)
from toolkit.models.transformers.spec import LogitTransform, model_spec
from toolkit.models.transformers.weights import checkpoint_renamer

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def transformers_class(config: Any) -> type:
    """transformers' causal-LM class for the config: the class config.architectures names
    (when transformers has it), else the one AutoModelForCausalLM maps the config type to.
    ValueError when there is none, when the named class is for another config type, or when
    its attention does not use the attention-function interface."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    if text is not config:
        raise ValueError(f"{type(config).__name__} is a composite (multimodal) config; the "
                         f"Transformers backend runs text causal LMs: pass its text config "
                         f"({type(text).__name__}) and the text model's weights")
    named = [getattr(transformers, a, None) for a in getattr(config, "architectures", None) or []]
    named = [c for c in named if isinstance(c, type) and hasattr(c, "config_class")]
    if named:
        cls = named[0]
        if not isinstance(config, cls.config_class):
            raise ValueError(f"config.architectures names {cls.__name__}, whose config is "
                             f"{cls.config_class.__name__}, but the config is {type(config).__name__}")
    else:
        try:
            cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        except KeyError:
            raise ValueError(f"transformers has no causal-LM class for model_type "
                             f"{getattr(config, 'model_type', None)!r} ({type(config).__name__}); the "
                             "Transformers backend runs AutoModelForCausalLM models") from None
    if not getattr(cls, "_supports_attention_backend", False):
        raise ValueError(f"{cls.__name__} (model_type {config.model_type!r}) does not route its "
                         "attention through transformers' attention-function interface "
                         "(_supports_attention_backend is False), so the Transformers backend "
                         "cannot run it on the paged KV cache; use a native model file, or a "
                         "family whose transformers class supports attention backends")
    return cls


class TransformersForCausalLM(nn.Module):
    """A transformers causal LM meeting the toolkit's Model contract (toolkit/models/base.py)."""

    def __init__(self, config: Any, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", group: Any = None, kernels: str = "auto",
                 eos_token_ids: list[int] | None = None) -> None:
        """The registry's constructor signature (toolkit/models/registry.py). group: one rank
        only (transformers' modules hold whole weights). kernels: checked, but only the
        attention is the toolkit's; every other op is transformers' own torch code."""
        super().__init__()
        from toolkit.models.ops import KERNELS

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        if group is not None and getattr(group, "size", 1) > 1:
            raise ValueError(f"the Transformers backend runs on one rank; got a tensor-parallel "
                             f"group of {group.size} (use model_impl='native' for tensor "
                             "parallelism, or tensor_parallel_size=1)")
        cls = transformers_class(config)
        register_toolkit_attention()
        device = torch.device(device)
        # a copy: transformers records attn_implementation on the config object it is given, and
        # the caller's config must not switch other models built from it to "toolkit"
        config = copy.deepcopy(config)
        with torch.device(device):
            self.hf = cls._from_config(config, attn_implementation=ATTN_IMPLEMENTATION, dtype=dtype)
        self.hf.eval().requires_grad_(False)
        self.config = self.hf.config
        self.dtype, self.device = dtype, device
        self.spec: ModelSpec = model_spec(self.config, self.hf, dtype, eos_token_ids)
        self.logit_transform = LogitTransform.from_config(self.config)
        self._norm_neutral = _norm_neutral_values(self.hf)
        if self.hf.get_output_embeddings() is None:
            raise ValueError(f"{type(self.hf).__name__} has no output embedding (lm_head) to "
                             "compute logits with")

    def extra_repr(self) -> str:
        s = self.spec
        return (f"transformers={type(self.hf).__name__}, layers={s.num_layers}, heads="
                f"{s.num_heads}/{s.num_kv_heads} (q/kv) x {s.head_dim}, vocab={s.vocab_size}, "
                f"dtype={self.dtype}")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """input_ids, positions int64 [T] -> hidden [T, D] (after the final norm).

        `attention` is the step's backend, planned with the batch's layout; it reaches each
        layer's attention call through transformers' kwargs, for this call only."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must be [T] each, got "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        step = StepContext(backend=attention, layers=self.spec.layers)
        out = self.hf.base_model(input_ids=input_ids[None], position_ids=positions[None],
                                 use_cache=False, **{CONTEXT_KWARG: step})
        return out.last_hidden_state[0]                                  # [T, D]

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [N, D] -> float32 logits [N, V], with the family's scaling / soft cap; into
        `out` (a contiguous float32 [N, V]: the engine's LM-head CUDA graphs) when given."""
        from toolkit.kernels.reference_model import check_logits_out

        check_logits_out(out, hidden.shape[0], self.spec.vocab_size)
        logits = self.logit_transform(self.hf.get_output_embeddings()(hidden).float())   # [N, V]
        return logits if out is None else out.copy_(logits)

    # ------------------------------------------------------------------ loading
    def expected_weights(self) -> dict[str, int]:
        """Checkpoint (state-dict) name -> 1 for each parameter (tied ones once)."""
        return {name: 1 for name, _ in self.hf.named_parameters()}

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[tuple[str, int]]:
        """Copy checkpoint tensors into the model, converting dtype and device; names are
        renamed as transformers' loader would (transformers/weights.py). Returns the
        (state-dict name, 0) pairs written. A tied output head's tensor is skipped (it is the
        embedding). ValueError on an unknown name, a shape mismatch, or a tensor that needs
        one of transformers' weight converters."""
        state = self.hf.state_dict(keep_vars=True)                       # params + persistent buffers
        tied = _tied_names(self.hf)
        rename = checkpoint_renamer(self.hf, state)
        loaded: set[tuple[str, int]] = set()
        for name, tensor in weights:
            target = rename(name)
            if target in tied or name.endswith("rotary_emb.inv_freq"):
                continue
            if target not in state:
                raise ValueError(f"checkpoint tensor {name!r} has no place in "
                                 f"{type(self.hf).__name__}; is it the right architecture?")
            dest = state[target].data
            if tuple(tensor.shape) != tuple(dest.shape):
                raise ValueError(f"shape mismatch for {name!r}: checkpoint has {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(dest.shape)}")
            dest.copy_(tensor)
            loaded.add((target, 0))
        return loaded

    @torch.no_grad()
    def init_random(self, std: float = 0.02, seed: int = 0) -> None:
        """The toolkit's random-weight rule (causal_lm.py): matrices and embeddings N(0, std),
        each from a generator seeded by its name, biases 0, norms at their neutral value
        (1, or 0 for the "1 + weight" norms of the Gemma families: what transformers'
        own init gave them when the model was built)."""
        for name, p in self.hf.named_parameters():
            if name in self._norm_neutral:
                p.fill_(self._norm_neutral[name])
            elif name.endswith("bias"):
                p.zero_()
            else:
                gen = torch.Generator(device=p.device).manual_seed(
                    seed * 1_000_003 + zlib.crc32(name.encode()))
                p.normal_(0.0, std, generator=gen)


def _norm_neutral_values(hf: nn.Module) -> dict[str, float]:
    """Parameter name -> its neutral value, for the parameters of norm modules (class name
    containing "Norm"), read right after transformers initialised them: a constant tensor
    keeps its value; anything else falls back to 1 for a weight, 0 for a bias."""
    out: dict[str, float] = {}
    for mod_name, mod in hf.named_modules():
        if "Norm" not in type(mod).__name__:
            continue
        for pname, p in mod.named_parameters(recurse=False):
            flat = p.detach().flatten()
            const = flat.numel() > 0 and bool((flat == flat[0]).all())
            out[f"{mod_name}.{pname}" if mod_name else pname] = (
                float(flat[0]) if const else (0.0 if pname == "bias" else 1.0))
    return out


def _tied_names(hf: nn.Module) -> set[str]:
    """State-dict names that are the same tensor as an earlier one (a tied lm_head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, t in hf.state_dict(keep_vars=True).items():
        key = t.data_ptr()
        if key in seen and t.numel():
            tied.add(name)
        seen.setdefault(key, name)
    return tied


def load_transformers_model(source: Any, *, dtype: torch.dtype = torch.float32,
                            device: torch.device | str = "cpu",
                            load_format: str = "auto", group: Any = None,
                            kernels: str = "auto") -> TransformersForCausalLM:
    """A TransformersForCausalLM from a local HF folder or a transformers config (random
    weights): `load_model(..., model_impl="transformers")`. group: a tensor-parallel Group;
    only one rank (None or size 1) is supported."""
    from toolkit.models.loader import load_model

    return load_model(source, dtype=dtype, device=device, load_format=load_format, group=group,
                      kernels=kernels, model_impl="transformers")
