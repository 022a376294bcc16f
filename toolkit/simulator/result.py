"""What a run (simulated or real) leaves: per-request token times and a per-step log.

Both `Simulator.run` and `replay.run_on_engine` return a `RunResult` in this one format
(times in seconds since the trace's start), so every metric and plot reads either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.simulator.cost import _is_decode
from toolkit.types import SchedulerOutput


@dataclass
class RequestTiming:
    request_id: str
    arrival: float
    prompt_len: int
    output_len: int                              # asked for
    client_id: str | None = None
    deadline: float | None = None                # seconds after arrival
    token_times: list[float] = field(default_factory=list)   # when each output token was reported
    finish: float | None = None
    finish_reason: str | None = None
    admitted: float | None = None               # when add_request had taken it (engine or simulator)
    # steps run (engine: step() calls of the run; simulator: its steps) when it was admitted,
    # and when its first token was reported: the step latency of TTFT, apart from step lengths
    admitted_step: int | None = None
    first_token_step: int | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def admission_wait(self) -> float | None:
        """Seconds from arrival until the engine had the request (the step in progress ends,
        then add_request): the part of TTFT before the request can be scheduled."""
        return None if self.admitted is None else self.admitted - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None with fewer than 2 tokens)."""
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class StepLog:
    time: float                    # when the step began (s since the trace's start)
    duration: float
    prefill_tokens: int
    decode_seqs: int
    num_running: int               # after the step
    num_waiting: int
    num_preempted: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_by_client: dict[str, int] = field(default_factory=dict)   # tokens granted per client

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / max(self.kv_blocks_total, 1)


def step_log(t: float, duration: float, out: SchedulerOutput, scheduler, allocator) -> StepLog:
    """The log entry of one step (read right after its update)."""
    by_client: dict[str, int] = {}
    prefill = decode = 0
    for s in out.scheduled:
        c = s.request.client_id or "-"
        by_client[c] = by_client.get(c, 0) + s.num_new_tokens
        if _is_decode(s):
            decode += 1
        else:
            prefill += s.num_new_tokens
    return StepLog(t, duration, prefill, decode, scheduler.num_running, scheduler.num_waiting,
                   len(out.preempted_ids), allocator.num_blocks - allocator.num_free_blocks(),
                   allocator.num_blocks, by_client)


@dataclass
class RunResult:
    requests: dict[str, RequestTiming]
    steps: list[StepLog]
    label: str = "run"
    num_preemptions: int = 0
    recording: Any = field(default=None, repr=False)   # engine runs: the TraceRecorder (step features, wall times)
    host_time: dict = field(default_factory=dict)      # engine runs: seconds in step() and in add_request
    num_lora_loads: int = 0                            # adapters copied into a slot (Simulator(max_loras=))

    def values(self, metric: str) -> np.ndarray:
        """float64 [n] of a per-request metric ("ttft", "tpot", "e2e", "admission_wait", "itl":
        all gaps), Nones left out."""
        if metric == "itl":
            return np.array([x for r in self.requests.values() for x in r.itls], dtype=np.float64)
        vals = [getattr(r, metric) for r in self.requests.values()]
        return np.array([v for v in vals if v is not None], dtype=np.float64)

    @property
    def makespan(self) -> float:
        ends = [r.finish for r in self.requests.values() if r.finish is not None]
        return max(ends) - min(r.arrival for r in self.requests.values()) if ends else 0.0

    def summary(self, **slo) -> dict:
        from toolkit.simulator.metrics import summarize

        return summarize(self, **slo)

    def __repr__(self) -> str:
        done = sum(r.finish is not None for r in self.requests.values())
        return (f"RunResult({self.label}: {done}/{len(self.requests)} finished in {len(self.steps)} steps, "
                f"makespan {self.makespan:.2f} s, {self.num_preemptions} preemptions)")
