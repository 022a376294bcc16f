"""Run a scheduler on a simulated clock with a fake model: per-request latencies, no GPU.

    res = simulate(ContinuousBatchingScheduler(alloc, block_size=16), arrivals)
    [r.latency for r in res.values()]

The fake model samples token `fake_token(request_id, position)`, a hash, so a request's
tokens do not depend on the batch around it (nor on preemption and recompute).
The research harness (fitted cost models, traces, metrics, plots, the same trace on the real
engine) is toolkit.simulator; this loop is its minimal core, kept for tests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

from toolkit.types import Request, SchedulerOutput


def fake_token(request_id: str, position: int, vocab_size: int) -> int:
    """The token a deterministic fake model samples at `position` (index in the sequence)."""
    h = hashlib.blake2b(f"{request_id}\x00{position}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") % vocab_size


def default_step_cost(out: SchedulerOutput) -> float:
    """Seconds per step: a fixed launch overhead plus a per-token cost."""
    return 0.01 + 2e-5 * out.total_num_scheduled_tokens


@dataclass
class SimResult:
    request_id: str
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_output_tokens: int = 0
    finish_reason: str | None = None

    @property
    def latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


def simulate(scheduler, arrivals: Sequence[tuple[float, Request]], *,
             step_cost: Callable[[SchedulerOutput], float] | float = default_step_cost,
             vocab_size: int = 32000, max_steps: int = 1_000_000) -> dict[str, SimResult]:
    """Feed `arrivals` ((time, request), any order) to `scheduler` on a simulated clock.

    Each step costs `step_cost(out)` seconds (or a constant); tokens come from `fake_token`.
    Returns {request_id: SimResult} with arrival, first-token and finish times.
    """
    cost = step_cost if callable(step_cost) else (lambda out, c=float(step_cost): c)
    pending = sorted(arrivals, key=lambda a: a[0])
    results: dict[str, SimResult] = {}
    now, k = 0.0, 0
    for _ in range(max_steps):
        while k < len(pending) and pending[k][0] <= now:
            t, req = pending[k]
            req.arrival_time = t
            results[req.request_id] = SimResult(req.request_id, t)
            scheduler.add_request(req)
            k += 1
        if not scheduler.has_unfinished():
            if k == len(pending):
                return results
            now = pending[k][0]
            continue
        out = scheduler.schedule()
        now += cost(out)
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                r = s.request
                sampled[s.request_id] = [fake_token(r.request_id, r.num_tokens, vocab_size)]  # drafts rejected
        for o in scheduler.update(out, sampled):
            res = results[o.request_id]
            if o.new_token_ids and res.first_token_time is None:
                res.first_token_time = now
            res.num_output_tokens += len(o.new_token_ids)
            if o.finished:
                res.finished_time, res.finish_reason = now, o.finish_reason
    raise RuntimeError(f"simulate: not done after max_steps={max_steps} steps; raise max_steps "
                       "or check that the scheduler makes progress")
