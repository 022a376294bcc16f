"""The policy API: what a scheduling policy decides, and when the scheduler asks.

A policy is a small object; the scheduler keeps the mechanism (token budget, blocks,
preemption by recompute, prefix hits) and asks the policy four things:

- **order**: `sort_key(request)` orders the running requests each step (who gets the token
  budget first) and, through `admission_key(request)` (default: `sort_key`), the waiting
  ones (who is admitted first). Smaller is first; ties keep insertion order (stable sort).
- **admission**: `admit(request) -> "admit" | "defer" | "reject"`, asked of each waiting
  request in admission order before the scheduler checks whether it fits. "defer" skips
  it this step: deferred requests are admitted only after every other waiting request
  (best effort, so none starves). "reject" finishes it now with finish reason "rejected"
  (only a request that has produced no token yet; one that has is deferred instead).
- **preemption victims**: `victim(candidates)` picks whom to preempt when blocks run out
  (default: the last by `sort_key`, the latest inserted on ties).
- **requirements**: `needs` names the Request fields the policy reads (`client_id`,
  `deadline`, `expected_output_len`); `check(request)` refuses, at `add_request`, a request
  that lacks one. `uses_priority = False` makes the engine warn when priorities are given.

What it may look at: `self.view` (a `SchedulerView`, given by `bind`): `now()` (the
scheduler's clock: time.monotonic in the engine, virtual in the simulator), the queues, and
`view.kv`, the KV cache's read-only queries (`num_free_blocks()`,
`num_cached_tokens(request)` = its prefix-cache hit now, ...).

Stateful policies (fair share counters) use the hooks `on_add(request)`,
`on_grant(scheduled)` (each grant of a step, as it is made), `on_finish(request)`;
`reset()` clears their state and runs at `bind`, so one object runs one scheduler at a
time, and a fresh run (a simulation, then the engine) starts clean: a scheduler whose
policy was bound by another since binds it back (reset) at its next add_request / schedule. With
`reorder_after_grant = True` the waiting queue is sorted again after each admission (a key
that a grant changes).

A new policy is a few lines:

    class ShortestPromptFirst(Policy):
        name = "spf"
        def sort_key(self, r): return (r.num_prompt_tokens, r.arrival_time)
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from toolkit.types import Request, ScheduledRequest

ADMIT, DEFER, REJECT = "admit", "defer", "reject"
VERDICTS = (ADMIT, DEFER, REJECT)

# the Request fields a policy may declare in `needs`, and how a caller gives each
FIELD_HINTS = {
    "client_id": "client_id= in add_request / generate",
    "deadline": "deadline= (seconds after arrival) in add_request / generate",
    "expected_output_len": "expected_output_len= in add_request / generate",
}


class Policy:
    name = "policy"
    needs: tuple[str, ...] = ()          # Request fields that must not be None
    uses_priority = False                # False: the engine warns when priorities are given
    reorder_after_grant = False          # True: the waiting queue is re-sorted after each admission
    view: Any = None                     # SchedulerView, set by bind()

    # -- life cycle --
    def bind(self, view: Any) -> None:
        """Called by the scheduler that runs this policy (once, at its construction)."""
        self.view = view
        self.reset()

    def reset(self) -> None:
        """Clear per-run state (counters); the base policy has none."""

    def now(self) -> float:
        """The scheduler's clock at the current step (time.monotonic() when unbound)."""
        return self.view.now() if self.view is not None else time.monotonic()

    def check(self, request: Request) -> None:
        """Refuse a request lacking a field this policy needs (ValueError naming it)."""
        for f in self.needs:
            if getattr(request, f, None) is None:
                raise ValueError(f"policy {self.name!r} needs request.{f}, and request "
                                 f"{request.request_id!r} has none; give "
                                 f"{FIELD_HINTS.get(f, f + '=')}, or use a policy that does not "
                                 "need it (e.g. 'fcfs')")

    # -- decisions --
    def sort_key(self, request: Request) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define sort_key(request)")

    def admission_key(self, request: Request) -> Any:
        return self.sort_key(request)

    def admit(self, request: Request) -> str:
        return ADMIT

    def victim(self, running: Sequence[Request]) -> Request:
        """The candidate served last (stable: the latest inserted among equal keys)."""
        if not running:
            raise ValueError("victim() needs at least one running request to choose from")
        return sorted(running, key=self.sort_key)[-1]

    # -- hooks for stateful policies --
    def on_add(self, request: Request) -> None:
        """A request was queued (not called for one rejected at add_request)."""

    def on_grant(self, scheduled: ScheduledRequest) -> None:
        """The scheduler granted these tokens this step (before the step runs)."""

    def on_finish(self, request: Request) -> None:
        """A queued request finished (any reason, abort included)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def is_decode(s: ScheduledRequest) -> bool:
    """Tokens past the prompt that sample (a decode step, with its drafts); a prompt chunk or
    a recompute after preemption is not. Valid at grant time (before update() appends)."""
    return s.samples and s.start >= s.request.num_prompt_tokens


class Adapted(Policy):
    """A duck-typed object with sort_key(request) and victim(running), as a Policy: the
    other decisions are the base policy's, or the object's where it defines them."""

    def __init__(self, obj: Any) -> None:
        self.wrapped = obj
        self.name = getattr(obj, "name", type(obj).__name__)
        self.needs = tuple(getattr(obj, "needs", ()))
        self.uses_priority = bool(getattr(obj, "uses_priority", False))
        self.reorder_after_grant = bool(getattr(obj, "reorder_after_grant", False))
        for m in ("sort_key", "victim", "admission_key", "admit", "on_add", "on_grant", "on_finish",
                  "reset"):
            if callable(getattr(obj, m, None)):
                setattr(self, m, getattr(obj, m))

    def bind(self, view: Any) -> None:
        self.view = view
        if callable(getattr(self.wrapped, "bind", None)):
            self.wrapped.bind(view)
        else:
            self.reset()

    def __repr__(self) -> str:
        return f"Adapted({self.wrapped!r})"
