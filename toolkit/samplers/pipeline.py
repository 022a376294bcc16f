"""The fast sampler: the whole batch at once, rows with mixed parameters, no host sync.

    sampler = Sampler()                                   # default_stages(), in the fixed order
    sampler.insert_after("temperature", MyStage())        # a stage: .name + (logits, meta) -> logits
    out = sampler(logits, meta)                           # SamplerOutput

Sampling is an exponential race (Gumbel-max) whose noise is a hash of (row key, token id):
a seeded row's key is seed_key(seed, number of output tokens), so its token does not depend
on the batch; unseeded rows draw their keys from the sampler's torch.Generator. On CUDA the
threshold, bitmask and race run as Triton kernels, elsewhere as their torch twins.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor

from toolkit.samplers.base import SamplerOutput, SamplingMetadata
from toolkit.samplers.logprobs import gather_logprobs
from toolkit.samplers.stages import (ROW_SCOPED, MinP, Stage, Temperature, TopK, TopP,
                                     default_stages, fusable_tail, kernel)


class Sampler:
    can_consume_logits = True      # __call__(..., consume_logits=True) processes logits in place

    def __init__(self, stages: Iterable[Stage] | None = None, *,
                 generator: torch.Generator | None = None, use_triton: bool | None = None) -> None:
        """stages: the pipeline (default: default_stages()); generator: the source of unseeded
        rows' keys (None: torch's default generator); use_triton: None = on CUDA only."""
        self.use_triton = use_triton
        self.generator = generator
        self.stages: list[Stage] = []
        for s in (default_stages(use_triton) if stages is None else stages):
            self._add(len(self.stages), s)

    # ---- composing the pipeline -------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def index(self, name: str) -> int:
        if name not in self.names:
            raise ValueError(f"no stage named {name!r}; stages: {self.names}")
        return self.names.index(name)

    def _add(self, i: int, stage: Stage) -> None:
        if not (isinstance(getattr(stage, "name", None), str) and callable(stage)):
            raise ValueError(f"a stage needs a str `name` and __call__(logits, meta) -> logits; "
                             f"got {stage!r}")
        if stage.name in self.names:
            raise ValueError(f"a stage named {stage.name!r} is already in {self.names}")
        self.stages.insert(i, stage)

    def insert_after(self, anchor: str, stage: Stage) -> "Sampler":
        self._add(self.index(anchor) + 1, stage)
        return self

    def insert_before(self, anchor: str, stage: Stage) -> "Sampler":
        self._add(self.index(anchor), stage)
        return self

    def replace(self, name: str, stage: Stage) -> "Sampler":
        i = self.index(name)
        del self.stages[i]
        self._add(i, stage)
        return self

    def remove(self, name: str) -> "Sampler":
        del self.stages[self.index(name)]
        return self

    def __repr__(self) -> str:
        cut = fusable_tail(self.stages)
        head = " -> ".join(self.names[:cut])
        tail = " -> ".join(self.names[cut:])
        fused = f"fused tail: {tail} + race" if tail else "fused tail: off"
        where = {None: "auto", True: "on", False: "off"}[self.use_triton]
        return f"Sampler({head}{' | ' if head else ''}{fused}; triton={where})"

    def _repr_html_(self) -> str:
        from toolkit.display import chips, html_table

        cut = fusable_tail(self.stages)
        return html_table("Sampler", {
            "stages": chips(self.names[:cut], "#e0e7ff"),
            "fused tail": (chips(self.names[cut:] + ["race"], "#fde68a") if cut < len(self.stages)
                           else "off (a stage after the tail, or no tail stage): stages then gumbel_sample"),
            "triton": {None: "on CUDA only", True: "on", False: "off"}[self.use_triton],
        }, kind="sampler")

    # ---- running it ---------------------------------------------------------------------
    def process(self, logits: Tensor, meta: SamplingMetadata,
                trace: list[tuple[str, Tensor]] | None = None) -> Tensor:
        """Processed logits float32 [N, V] (-inf = excluded); `trace` gets (name, copy) per stage."""
        if tuple(logits.shape) != (meta.num_rows, meta.vocab_size):
            raise ValueError(f"logits must be [num_rows, vocab_size] = "
                             f"[{meta.num_rows}, {meta.vocab_size}], got {list(logits.shape)}")
        x = logits.to(torch.float32).clone()                                 # stages work in place
        if trace is not None:
            trace.append(("logits", x.clone()))
        for stage in self.stages:
            x = stage(x, meta)
            if trace is not None:
                trace.append((stage.name, x.clone()))
        return x

    def keys(self, meta: SamplingMetadata, generator: torch.Generator | None = None) -> Tensor:
        """int64 [N] noise keys: seed_key for seeded rows, fresh random ones for the others."""
        if meta.any_seeded and all(p.seed is not None for p in meta.params):
            return meta.seed_keys
        gen = generator if generator is not None else self.generator
        fresh = torch.randint(0, 2 ** 62, (meta.num_rows,), generator=gen,
                              device=meta.seed_keys.device, dtype=torch.int64)
        return torch.where(meta.seeded, meta.seed_keys, fresh)

    def _tail_rows(self, meta: SamplingMetadata, cut: int,
                   generator: torch.Generator | None = None) -> dict[str, Tensor | None]:
        """truncated_sample's per-row arguments [N] for the fused tail self.stages[cut:] (a
        tail stage that is absent passes None, or ones for the temperature); draws the keys."""
        tail = {type(s) for s in self.stages[cut:]}
        return dict(temperature=meta.temperature if Temperature in tail else torch.ones_like(meta.temperature),
                    greedy=meta.greedy, min_p=meta.min_p if MinP in tail else None,
                    top_k=meta.top_k if TopK in tail else None,
                    top_p=meta.top_p if TopP in tail else None, keys=self.keys(meta, generator))

    def graph_tail(self, meta: SamplingMetadata, generator: torch.Generator | None = None,
                   ) -> tuple[Callable[..., Tensor], dict[str, Tensor | None]] | None:
        """This step's sampling as `fn(logits, **rows)` -> tokens [N], when it is the fused tail
        alone: the Triton kernel, no stage before the tail active, not every row greedy, no
        logprobs and no top-k row (whose cut needs its own kernel). rows are the per-row
        tensors [N] (None: unused), the noise keys drawn now. fn runs a fixed sequence of
        kernels with no host decision, so the engine may capture it in a CUDA graph over
        padded rows and replay it (worker/sample_graphs.py). None: sample through __call__."""
        cut = fusable_tail(self.stages)
        triton = meta.device.type == "cuda" if self.use_triton is None else self.use_triton
        if (not triton or cut == len(self.stages) or meta.num_rows == 0 or meta.all_greedy
                or meta.max_num_logprobs is not None
                or (meta.top_k is not None and meta.top_k_rows is not None)
                or any(getattr(s, "active", lambda m: True)(meta) for s in self.stages[:cut])):
            return None
        return kernel("truncated_sample", meta.temperature, True), self._tail_rows(meta, cut, generator)

    def __call__(self, logits: Tensor, meta: SamplingMetadata,
                 generator: torch.Generator | None = None, *,
                 consume_logits: bool = False) -> SamplerOutput:
        """logits float [N, V] -> SamplerOutput; logprobs (raw log_softmax) when a row asks.

        Runs the stages that are active for this batch (the raw logits are copied once, and
        only if one is), then the fused tail `truncated_sample` when the pipeline ends with
        temperature / min_p / top_k / top_p stages, else the stages and `gumbel_sample`.
        consume_logits: the caller no longer needs `logits` (an engine step's own output), so
        float32 logits may be processed in place: no copy but of the rows asking for logprobs
        that a stage may change (with only built-in stages, `ROW_SCOPED`, the rows their
        parameters name: `meta.logprob_changed_rows`; with a user's stage, every asking row).
        """
        if tuple(logits.shape) != (meta.num_rows, meta.vocab_size):
            raise ValueError(f"logits must be [num_rows, vocab_size] = "
                             f"[{meta.num_rows}, {meta.vocab_size}], got {list(logits.shape)}")
        cut = fusable_tail(self.stages)
        active = [s for s in self.stages[:cut] if getattr(s, "active", lambda m: True)(meta)]
        x, raw = logits, logits                               # raw: what the logprobs read
        saved = saved_rows = None                             # raw copies of rows changed in place
        if active:                                            # the stages work in place
            if not (consume_logits and logits.dtype == torch.float32):
                x = logits.to(torch.float32, copy=True)
            elif meta.max_num_logprobs is not None:           # keep the asking rows' raw logits
                if all(type(s) in ROW_SCOPED for s in active):   # only the rows they may change
                    saved_rows = meta.logprob_changed_rows
                elif meta.logprob_rows is not None:
                    saved_rows = meta.logprob_rows
                else:
                    raw = logits.clone()
                if saved_rows is not None:
                    saved = logits.index_select(0, saved_rows)
            for stage in active:
                x = stage(x, meta)
        if x.dtype != torch.float32 or x.stride(-1) != 1:
            x = x.to(torch.float32).contiguous()
        if meta.all_greedy:
            tokens = torch.argmax(x, dim=-1)                                 # first max = lowest id
        elif cut < len(self.stages):
            rows = self._tail_rows(meta, cut, generator)
            kth = None
            if rows["top_k"] is not None and meta.top_k_rows is not None:   # the top-k cut, given
                kth = kernel("kth_largest", x, self.use_triton)(x, rows["top_k"], meta.top_k_rows,
                                                                meta.max_top_k)
            tokens = kernel("truncated_sample", x, self.use_triton)(x, **rows, kth_largest=kth)
        else:
            sample = kernel("gumbel_sample", x, self.use_triton)
            tokens = sample(x, self.keys(meta, generator), meta.greedy)
        if meta.max_num_logprobs is None:
            return SamplerOutput(tokens)
        values, ids, ranks = gather_logprobs(raw, tokens, meta.max_num_logprobs, meta.logprob_rows,
                                             saved=saved, saved_rows=saved_rows,
                                             use_triton=self.use_triton)
        return SamplerOutput(tokens, values, ids, ranks)
