"""Earliest deadline first with SLO-aware admission.

A request's deadline is `arrival_time + request.deadline` (seconds after its arrival).
Waiting and running requests are served earliest deadline first; the preemption victim is
the latest deadline. Admission is SLO-aware: a waiting request that cannot finish by its
deadline any more, by the estimate

    now + prompt tokens still to compute / prefill_tokens_per_s + output tokens left * tpot

(output tokens left: expected_output_len if given, else max_tokens, minus what it has) is
not allowed to take capacity from requests that can: `on_miss="defer"` admits it only
after every other waiting request (best effort), `on_miss="reject"` finishes it at once
with finish reason "rejected" (goodput: its slot goes to a request that can still make it).
`estimate(request, now) -> seconds` replaces the built-in estimate, e.g.
`CostModel.finish_estimate(batch=..., context=...)` from a fitted cost model
(toolkit/simulator/cost.py).

A request without a deadline is served after every request with one, first come first
served among themselves, and is always admitted (it has no SLO to miss).
"""

from __future__ import annotations

from typing import Any, Callable

from toolkit.schedulers.policy_base import ADMIT, DEFER, REJECT, Policy
from toolkit.types import Request


class EDF(Policy):
    name = "edf"

    def __init__(self, *, slo_admission: bool = True, tpot: float = 0.05,
                 prefill_tokens_per_s: float = 5000.0, on_miss: str = "defer",
                 estimate: Callable[[Request, float], float] | None = None) -> None:
        if on_miss not in (DEFER, REJECT):
            raise ValueError(f"on_miss must be 'defer' or 'reject', got {on_miss!r}")
        if not (tpot >= 0 and prefill_tokens_per_s > 0):
            raise ValueError(f"tpot must be >= 0 and prefill_tokens_per_s > 0, got {tpot}, {prefill_tokens_per_s}")
        self.slo_admission, self.on_miss = bool(slo_admission), on_miss
        self.tpot, self.prefill_tokens_per_s = float(tpot), float(prefill_tokens_per_s)
        self.estimate = estimate

    @staticmethod
    def due(request: Request) -> float:
        """When it is due (inf: no deadline)."""
        return float("inf") if request.deadline is None else request.arrival_time + request.deadline

    def sort_key(self, request: Request) -> Any:
        return (request.deadline is None, self.due(request), request.arrival_time)

    def time_to_finish(self, request: Request, now: float) -> float:
        """Seconds the request still needs, by `estimate` or the built-in estimate."""
        if self.estimate is not None:
            return float(self.estimate(request, now))
        want = request.expected_output_len
        if want is None:
            want = request.sampling_params.max_tokens
        out_left = max(want - request.num_output_tokens, 1)
        prefill_left = max(request.num_tokens - request.num_computed_tokens, 0)
        return prefill_left / self.prefill_tokens_per_s + out_left * self.tpot

    def admit(self, request: Request) -> str:
        if not self.slo_admission or request.deadline is None:
            return ADMIT
        now = self.now()
        return ADMIT if now + self.time_to_finish(request, now) <= self.due(request) else self.on_miss

    def __repr__(self) -> str:
        return (f"EDF(slo_admission={self.slo_admission}, tpot={self.tpot}, "
                f"prefill_tokens_per_s={self.prefill_tokens_per_s}, on_miss={self.on_miss!r})")
