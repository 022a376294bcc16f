"""Traces: who arrives when, with what prompt, wanting how many output tokens.

A `Trace` is plain data (JSON round-trip) that both the simulator and the real engine run
(`Simulator.run(trace)`, `replay.run_on_engine(llm, trace)`), so both see the same prompts,
arrival times and output lengths, and the same per-request policy fields (client_id,
priority, deadline, expected_output_len).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.types import Request, SamplingParams


@dataclass
class TraceRequest:
    request_id: str
    arrival: float                       # seconds after the trace's start
    prompt_ids: list[int]
    output_len: int                      # tokens generated (max_tokens with ignore_eos)
    client_id: str | None = None
    priority: int = 0
    deadline: float | None = None        # seconds after arrival
    expected_output_len: int | None = None
    lora_id: int | None = None           # the LoRA adapter it runs (Simulator(max_loras=...)); None: base
    task: str | None = None              # a pooling job ("embed", "classify", "score"): prefill-only, no output

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def policy_fields(self) -> dict:
        return dict(client_id=self.client_id, priority=self.priority, deadline=self.deadline,
                    expected_output_len=self.expected_output_len)

    def to_request(self, t0: float = 0.0) -> Request:
        """A scheduler Request arriving at t0 + arrival (greedy, ignore_eos, output_len tokens)."""
        if self.task is not None:            # the job class the scheduler sees: prefill-only
            from toolkit.pooling.params import PoolingParams

            return Request(self.request_id, list(self.prompt_ids), SamplingParams(max_tokens=1),
                           arrival_time=t0 + self.arrival, pooling_params=PoolingParams(task=self.task),
                           **self.policy_fields())
        sp = SamplingParams(max_tokens=self.output_len, ignore_eos=True, temperature=0.0)
        lora = {}
        if self.lora_id:                 # as the engine keys it: no KV shared across adapters
            from toolkit.lora.request import LoRARequest, adapter_salt

            lora = dict(lora_request=LoRARequest(f"lora{self.lora_id}", self.lora_id),
                        cache_salt=adapter_salt(self.lora_id))
        return Request(self.request_id, list(self.prompt_ids), sp, arrival_time=t0 + self.arrival,
                       **self.policy_fields(), **lora)


@dataclass
class Trace:
    requests: list[TraceRequest]
    label: str = "trace"                  # says where the lengths came from (e.g. "synthetic lognormal")
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.requests = sorted(self.requests, key=lambda r: r.arrival)
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("trace request ids must be unique")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival if self.requests else 0.0

    @property
    def clients(self) -> list[str]:
        return sorted({r.client_id for r in self.requests if r.client_id is not None})

    def with_fields(self, **fields) -> "Trace":
        """A copy with these fields set on every request (e.g. deadline=5.0)."""
        reqs = [TraceRequest(**{**asdict(r), **fields}) for r in self.requests]
        return Trace(reqs, self.label, dict(self.meta))

    def head(self, n: int) -> "Trace":
        return Trace(self.requests[:n], self.label, dict(self.meta))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"label": self.label, "meta": self.meta,
                                          "requests": [asdict(r) for r in self.requests]}))

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        d = json.loads(Path(path).read_text())
        return cls([TraceRequest(**r) for r in d["requests"]], d.get("label", "trace"), d.get("meta", {}))

    def __repr__(self) -> str:
        if not self.requests:
            return f"Trace(0 requests, {self.label})"
        p = sum(r.prompt_len for r in self.requests) / len(self)
        o = sum(r.output_len for r in self.requests) / len(self)
        return (f"Trace({len(self)} requests over {self.duration:.1f} s, mean prompt {p:.0f} / "
                f"output {o:.0f} tokens, clients={self.clients or '-'}, {self.label})")
