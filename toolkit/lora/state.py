"""LoRAState: the worker side of multi-LoRA, owned by the runner.

    linear_method(base)      the model's linear_method= function: each adaptable layer gets a
                             LoRALinearMethod around the method `base` gives it (or dense)
    attach(model)            find those layers and their checkpoint names after the build
    register(lora_request)   read and check an adapter (host cache), ValueError if it cannot run
    begin_step(out)          load the step's adapters into the slots the scheduler's pool gave
                             them (out.lora_slots) and fill `indices` [T]: each token's slot;
                             = apply(step_plan(out)), and the LoRAStep it returns is what the
                             other tensor-parallel ranks apply to their own LoRAState

The slots' assignment (which adapter, LRU, reference counts) is the scheduler's AdapterPool;
this object only mirrors it in device memory: it knows what each slot holds and copies an
adapter in when the plan names one it does not hold. Nothing is module-level: the layers
reach `indices` through this object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from toolkit.lora.host_cache import HostAdapterCache
from toolkit.lora.layer import LoRALinearMethod
from toolkit.lora.peft import AdapterWeights, read_adapter
from toolkit.lora.request import LoRARequest
from toolkit.types import RequestFault

# the toolkit's module names of adaptable linears (merged ones hold several PEFT targets)
ADAPTABLE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "q_proj", "k_proj", "v_proj",
             "gate_proj", "up_proj")


class _Unreadable(Exception):
    """An adapter a step must load could not be read (LoRAState.begin_step names its requests)."""

    def __init__(self, adapter: int, name: str, error: Exception) -> None:
        super().__init__(adapter, name, error)
        self.adapter, self.name, self.error = adapter, name, error


class LoRAState:
    def __init__(self, *, max_loras: int, max_lora_rank: int, max_cpu_loras: int, max_tokens: int,
                 device: torch.device | str, backend: str = "auto") -> None:
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.device, self.backend = torch.device(device), backend
        self.host = HostAdapterCache(max_cpu_loras)
        # [max_tokens] each token's slot (-1: base); a graph input, filled in place each step
        self.indices = torch.full((max_tokens,), -1, dtype=torch.int32, device=self.device)
        self.layers: dict[str, tuple[torch.nn.Module, LoRALinearMethod, list[str]]] = {}
        self.slot_holds: list[int | None] = [None] * max_loras   # adapter id in each slot
        self.known: dict[int, LoRARequest] = {}                # registered adapters, by id
        self.num_loads = 0

    # -- building --
    def linear_method(self, base: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
        from toolkit.models.layers.linear import UnquantizedLinearMethod

        def method(name: str) -> Any:
            inner = base(name) if base is not None else None
            if name.rsplit(".", 1)[-1] not in ADAPTABLE:
                return inner
            return LoRALinearMethod(inner if inner is not None else UnquantizedLinearMethod(), self)
        method.around = self.linear_method     # load_model rebuilds it around a quantization scheme
        return method

    def attach(self, model: torch.nn.Module) -> None:
        """Record the LoRA layers and, per part, the checkpoint module name an adapter uses
        (qkv_proj's parts are q_proj, k_proj, v_proj: the model's `stacked` table)."""
        inverse = {(merged, sid): ckpt for ckpt, (merged, sid) in getattr(model, "stacked", {}).items()}
        for name, mod in model.named_modules():
            method = getattr(mod, "method", None)
            if isinstance(method, LoRALinearMethod):
                prefix, last = name.rsplit(".", 1)
                ckpt = [name if sid is None else f"{prefix}.{inverse[(last, sid)]}" for sid in method.shard_ids]
                self.layers[name] = (mod, method, ckpt)
        if not self.layers:
            raise ValueError(f"enable_lora: {type(model).__name__} has no linear layer LoRA can adapt "
                             f"(a native model with {ADAPTABLE})")

    # -- adapters --
    def register(self, lora: LoRARequest) -> AdapterWeights:
        """Read `lora` (or take it from the host cache) and check it against the model;
        ValueError naming what does not fit. A known id must keep its name and path."""
        if not isinstance(lora, LoRARequest):
            raise TypeError(f"lora_request must be a toolkit.LoRARequest, got {type(lora).__name__}")
        old = self.known.get(lora.lora_int_id)
        if old is not None and (old.lora_name, old.lora_path) != (lora.lora_name, lora.lora_path):
            raise ValueError(f"lora_int_id {lora.lora_int_id} is already adapter {old.lora_name!r} "
                             f"({old.lora_path}); each adapter needs its own id")
        w = self.host.get(lora.lora_int_id, lambda: self._read(lora))
        self.known[lora.lora_int_id] = lora
        return w

    def _read(self, lora: LoRARequest) -> AdapterWeights:
        w = read_adapter(lora.lora_path, lora.lora_int_id, lora.lora_name, self.max_lora_rank)
        shapes = {ck: shp for mod, m, cks in self.layers.values() for ck, shp in zip(cks, m.full_shapes(mod))}
        for module, (a, b) in w.modules.items():
            if module not in shapes:
                raise ValueError(f"adapter {lora.lora_name!r} targets {module!r}, which this model does not "
                                 f"have (e.g. {next(iter(shapes))!r})")
            n_in, n_out = shapes[module]
            if a.shape[1] != n_in or b.shape[0] != n_out:
                raise ValueError(f"adapter {lora.lora_name!r}: {module} has A {tuple(a.shape)} and B "
                                 f"{tuple(b.shape)}; this model needs [r, {n_in}] and [{n_out}, r] (an adapter "
                                 "of another base model?)")
        return w

    # -- the step --
    def step_plan(self, out: Any, num_tokens: int) -> LoRAStep:
        """The step's LoRA part as data a tensor-parallel rank can apply (picklable): which
        adapter each slot must hold, their requests, and each of the num_tokens (padded)
        tokens' slot."""
        if num_tokens > self.indices.shape[0]:
            raise ValueError(f"a step of {num_tokens} tokens exceeds the LoRA index buffer of "
                             f"{self.indices.shape[0]} (max_num_batched_tokens)")
        slots: dict[int, int] = dict(getattr(out, "lora_slots", None) or {})
        per_req = [slots[s.request.lora_request.lora_int_id] if s.request.lora_request is not None else -1
                   for s in out.scheduled]                 # one slot per request, repeated per token
        idx = np.full(num_tokens, -1, dtype=np.int32)      # CUDA-graph padding rows stay -1
        n = sum(s.num_new_tokens for s in out.scheduled)
        idx[:n] = np.repeat(np.asarray(per_req, dtype=np.int32), [s.num_new_tokens for s in out.scheduled])
        return LoRAStep(slots, {a: self.known[a] for a in slots}, idx)

    @torch.inference_mode()
    def apply(self, step: LoRAStep) -> None:
        """Load the adapters the step puts in slots that do not hold them (a rank reads its own
        slices from the folder, through its host cache), then write `indices` (stream order:
        after the last step's forward, before this one's)."""
        for adapter, slot in step.slots.items():
            if self.slot_holds[slot] != adapter:
                req = step.requests[adapter]
                if self.known.get(adapter) != req:         # a rank learns adapters from the steps
                    self.known[adapter] = req
                    self.host.pop(adapter)
                try:
                    w = self.register(req)
                except (OSError, ValueError) as e:
                    raise _Unreadable(adapter, req.lora_name, e) from e
                self._load(slot, w)
        n = step.indices.shape[0]
        self.indices[:n].copy_(torch.from_numpy(step.indices), non_blocking=self.device.type == "cuda")

    def begin_step(self, out: Any, num_tokens: int) -> LoRAStep:
        """step_plan + apply on this rank; the plan goes on to the other ranks (TP). An adapter
        that cannot be read again (its folder moved since add_request, while the host cache
        had dropped it) fails its requests alone (RequestFault), not the step's others."""
        step = self.step_plan(out, num_tokens)
        try:
            self.apply(step)
        except _Unreadable as e:
            rids = [s.request_id for s in out.scheduled
                    if s.request.lora_request is not None and s.request.lora_request.lora_int_id == e.adapter]
            raise RequestFault(rids, f"LoRA adapter {e.name!r} could not be loaded again: {e.error}") from e.error
        return step

    def _load(self, slot: int, w: AdapterWeights) -> None:
        for mod, method, ckpt in self.layers.values():
            method.load_slot(mod, slot, [w.modules.get(c) for c in ckpt])
        self.slot_holds[slot] = w.lora_int_id
        self.num_loads += 1

    def spec(self) -> dict[str, Any]:
        """The arguments another rank builds its own LoRAState from (its device aside)."""
        return {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank,
                "max_cpu_loras": self.host.capacity, "max_tokens": self.indices.shape[0],
                "backend": self.backend}

    def __repr__(self) -> str:
        return (f"LoRAState(slots={self.slot_holds}, max_rank={self.max_lora_rank}, {len(self.layers)} layers, "
                f"{self.host!r})")



@dataclass
class LoRAStep:
    """One step's LoRA part (numpy and plain objects: it crosses a pipe to TP ranks)."""
    slots: dict[int, int]                      # adapter id -> the slot it runs from
    requests: dict[int, LoRARequest]           # adapter id -> its request (folder to read)
    indices: np.ndarray                        # int32 [T] each token's slot, -1 = base
