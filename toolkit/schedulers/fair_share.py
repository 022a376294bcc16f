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

A request without a client_id counts as one shared client (None). The state is bounded:
only active clients (with queued requests) are scanned at an add, and past `max_idle_clients`
idle counters those no higher than every active one's go first (a returning client would
be lifted to that anyway), then the longest idle.
"""

from __future__ import annotations

from typing import Any

from toolkit.schedulers.policy_base import Policy, is_decode
from toolkit.types import Request, ScheduledRequest


class VTC(Policy):
    name = "vtc"
    reorder_after_grant = True

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0, *,
                 max_idle_clients: int = 1024) -> None:
        if not (input_weight >= 0 and output_weight >= 0 and input_weight + output_weight > 0):
            raise ValueError(f"VTC weights must be >= 0 and not both 0, got input_weight={input_weight}, "
                             f"output_weight={output_weight}")
        if not isinstance(max_idle_clients, int) or max_idle_clients < 0:
            raise ValueError(f"max_idle_clients must be an integer >= 0, got {max_idle_clients!r}")
        self.input_weight, self.output_weight = float(input_weight), float(output_weight)
        self.max_idle_clients = max_idle_clients
        self.reset()

    def reset(self) -> None:
        # client -> service received (None: requests without a client_id); idle clients in the
        # order they went idle (oldest first: the first dropped)
        self.counters: dict[str | None, float] = {}
        self._live: dict[str | None, int] = {}        # active client -> its queued requests

    def sort_key(self, request: Request) -> Any:
        return (self.counters.get(request.client_id, 0.0), request.arrival_time)

    def on_add(self, request: Request) -> None:
        c = request.client_id
        if c not in self._live:                 # lifted to the least-served active client
            floor = min((self.counters.get(v, 0.0) for v in self._live), default=0.0)
            self.counters[c] = max(self.counters.get(c, 0.0), floor)
            self._live[c] = 0
        self._live[c] += 1

    def on_finish(self, request: Request) -> None:
        c = request.client_id
        n = self._live.get(c, 0)
        if n > 1:
            self._live[c] = n - 1
        elif n == 1:
            del self._live[c]
            self.counters[c] = self.counters.pop(c, 0.0)     # now the most recently idle
            if len(self.counters) > len(self._live) + self.max_idle_clients:
                self._forget_idle()

    def _forget_idle(self) -> None:
        """Bring the idle counters down to half of max_idle_clients (amortized O(1) a finish)."""
        keep = self.max_idle_clients // 2
        floor = min((self.counters.get(v, 0.0) for v in self._live), default=None)
        idle = [c for c in self.counters if c not in self._live]
        drop = [c for c in idle if floor is not None and self.counters[c] <= floor]
        rest = [c for c in idle if floor is None or self.counters[c] > floor]
        drop += rest[: max(len(rest) - keep, 0)]             # the longest idle
        for c in drop:
            del self.counters[c]

    def on_grant(self, s: ScheduledRequest) -> None:
        w = self.output_weight if is_decode(s) else self.input_weight
        c = s.request.client_id
        self.counters[c] = self.counters.get(c, 0.0) + w * s.num_new_tokens

    def __repr__(self) -> str:
        return (f"VTC(input_weight={self.input_weight}, output_weight={self.output_weight}, "
                f"max_idle_clients={self.max_idle_clients})")
