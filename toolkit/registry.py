"""Component registry: pick a part by name, class or instance.

Names map to "module:Class" strings imported lazily, so importing the toolkit
imports no kernel or model code. An unknown name lists the valid ones.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

REGISTRY: dict[str, dict[str, str | type]] = {
    "allocator": {
        "free_list": "toolkit.blocks.free_list:FreeListAllocator",
        "prefix_caching": "toolkit.blocks.prefix_caching:PrefixCachingAllocator",
        "reference": "toolkit.blocks.reference:ReferenceAllocator",
        "radix": "toolkit.blocks.radix:RadixAllocator",
    },
    "scheduler": {
        "continuous": "toolkit.schedulers.continuous:ContinuousBatchingScheduler",
        "static": "toolkit.schedulers.static:StaticBatchingScheduler",
        "reference": "toolkit.schedulers.reference:ReferenceScheduler",
    },
    "sampler": {
        "default": "toolkit.samplers.pipeline:Sampler",
        "reference": "toolkit.samplers.reference:ReferenceSampler",
    },
    "attention": {
        "cpu": "toolkit.attention.cpu:CPUAttention",
        "torch": "toolkit.attention.torch_ref:TorchAttention",
        "triton": "toolkit.attention.triton_paged:TritonPagedAttention",
    },
    "model": {
        "LlamaForCausalLM": "toolkit.models.llama:LlamaForCausalLM",
        "MistralForCausalLM": "toolkit.models.llama:LlamaForCausalLM",
        "Qwen2ForCausalLM": "toolkit.models.llama:LlamaForCausalLM",
        "Qwen3ForCausalLM": "toolkit.models.llama:LlamaForCausalLM",
        "Gemma2ForCausalLM": "toolkit.models.gemma:Gemma2ForCausalLM",
        "Gemma3ForCausalLM": "toolkit.models.gemma:Gemma3ForCausalLM",
        "Phi3ForCausalLM": "toolkit.models.phi3:Phi3ForCausalLM",
        "MixtralForCausalLM": "toolkit.models.mixtral:MixtralForCausalLM",
        "Qwen3MoeForCausalLM": "toolkit.models.qwen3_moe:Qwen3MoeForCausalLM",
        "OlmoeForCausalLM": "toolkit.models.olmoe:OlmoeForCausalLM",
        "Dots1ForCausalLM": "toolkit.models.dots1:Dots1ForCausalLM",
        "BertModel": "toolkit.models.bert:BertModel",
        "BertForSequenceClassification": "toolkit.models.bert:BertForSequenceClassification",
    },
    "proposer": {
        "ngram": "toolkit.samplers.speculative.ngram:NgramProposer",
        "draft": "toolkit.samplers.speculative.draft:DraftModelProposer",
    },
    "router": {
        "round_robin": "toolkit.routing.simple:RoundRobinRouter",
        "least_loaded": "toolkit.routing.simple:LeastLoadedRouter",
        "power_of_two": "toolkit.routing.simple:PowerOfTwoRouter",
        "prefix_affinity": "toolkit.routing.prefix:PrefixAffinityRouter",
        "cache_aware": "toolkit.routing.prefix:CacheAwareRouter",
    },
}


def lookup(kind: str, name: str) -> type:
    """The class registered as `name` for `kind` ("allocator", "scheduler", ...)."""
    if kind not in REGISTRY:
        raise ValueError(f"unknown component kind {kind!r}; valid kinds: {sorted(REGISTRY)}")
    table = REGISTRY[kind]
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid names: {sorted(table)}")
    entry = table[name]
    if not isinstance(entry, str):                 # a class registered as an object
        return entry
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def register(kind: str, name: str, target: str | type) -> None:
    """Add a component: `target` is a class (kept as it is, so a class defined in a notebook
    or a script works) or a "module:Class" string (imported when first looked up)."""
    REGISTRY.setdefault(kind, {})[name] = target


def create(kind: str, spec: Any, /, **kwargs: Any) -> Any:
    """An instance from a name (looked up), a class (constructed with kwargs) or an instance."""
    if isinstance(spec, str):
        return lookup(kind, spec)(**kwargs)
    if isinstance(spec, type):
        return spec(**kwargs)
    return spec


# what each kind of part must have (the contracts in blocks/base.py, schedulers/base.py,
# samplers/base.py, attention/base.py, samplers/speculative/base.py)
REQUIRED = {
    "allocator": ("num_free_blocks", "allocate", "free", "fork", "lookup", "peek", "publish",
                  "ref_count", "num_cached_blocks"),
    "scheduler": ("add_request", "abort", "schedule", "update", "has_unfinished"),
    "sampler": ("__call__",),
    "attention": ("plan", "write_kv", "run"),
    "proposer": ("propose", "remove"),
    "router": ("choose",),
}


def create_part(kind: str, spec: Any, **kwargs: Any) -> Any:
    """A part from a registered name, a class or a factory (a function or functools.partial:
    called with the engine settings its signature accepts), or an instance; refused with a
    message when it lacks what its contract requires."""
    if spec is None or isinstance(spec, (bool, int, float)):
        raise ValueError(f"{kind}={spec!r}: give a registered name ({sorted(REGISTRY[kind])}), "
                         f"a class, a factory function or an instance")
    cls = lookup(kind, spec) if isinstance(spec, str) else spec
    factory = isinstance(cls, (type, functools.partial)) or inspect.isfunction(cls) or inspect.ismethod(cls)
    if factory:
        sig = inspect.signature(cls.__init__ if isinstance(cls, type) else cls)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
        if isinstance(cls, functools.partial):       # what the user bound wins
            kwargs = {k: v for k, v in kwargs.items() if k not in cls.keywords}
        part = cls(**kwargs)
    else:
        part = cls
    missing = [m for m in REQUIRED.get(kind, ()) if not callable(getattr(part, m, None))]
    if missing:
        raise ValueError(f"{kind} {part!r} lacks {missing}, which the {kind} contract requires "
                         f"(see docs/interfaces.md)")
    return part
