"""Virtual token counter (VTC) fair share across clients (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024).

Each client has a counter of the service it got: w_in per prompt (prefill) token and
w_out per decode token, charged as the scheduler grants them (tokens computed: a
prefix-cache hit is not charged; a recompute after preemption is, at w_in). Waiting requests are
admitted from the client with the smallest counter (re-sorted after every admission, as
the counter moves); running ones are served in that order too, so the preemption victim
is the most-served client's latest request. A client that comes back after being idle
has its counter lifted to the smallest counter among the active clients (the paper's
rule), so idling does not bank credit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from toolkit.schedulers.policy_base import Policy, is_decode
from toolkit.types import Request, ScheduledRequest


class VTC(Policy):
    name = "vtc"
    needs = ("client_id",)
    reorder_after_grant = True

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        if not (input_weight >= 0 and output_weight >= 0 and input_weight + output_weight > 0):
            raise ValueError(f"VTC weights must be >= 0 and not both 0, got input_weight={input_weight}, "
                             f"output_weight={output_weight}")
        self.input_weight, self.output_weight = float(input_weight), float(output_weight)
        self.reset()

    def reset(self) -> None:
        self.counters: dict[str, float] = defaultdict(float)   # client -> service received
        self._live: dict[str, int] = defaultdict(int)          # client -> queued requests

    def sort_key(self, request: Request) -> Any:
        return (self.counters[request.client_id], request.arrival_time)

    def on_add(self, request: Request) -> None:
        c = request.client_id
        if self._live[c] == 0:
            active = [self.counters[v] for v, n in self._live.items() if n > 0]
            if active:
                self.counters[c] = max(self.counters[c], min(active))
        self._live[c] += 1

    def on_finish(self, request: Request) -> None:
        c = request.client_id
        if self._live.get(c, 0) > 0:
            self._live[c] -= 1

    def on_grant(self, s: ScheduledRequest) -> None:
        w = self.output_weight if is_decode(s) else self.input_weight
        self.counters[s.request.client_id] += w * s.num_new_tokens

    def __repr__(self) -> str:
        return f"VTC(input_weight={self.input_weight}, output_weight={self.output_weight})"
