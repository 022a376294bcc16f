"""Scheduling policies: the classics, and how a name, class or instance becomes one.

The API (order, admission, preemption victims, what a policy may look at) is documented in
toolkit/schedulers/policy_base.py. Built in, by name:

    "fcfs"        FCFS                      arrival order (the default)
    "priority"    Priority()                lower `priority` first; Priority(aging=a): a
                                            request gains `a` levels per second waited
    "sjf"         SJF("prompt")             shortest prompt first
    "sjf_output"  SJF("output")             shortest expected output first (needs
                                            expected_output_len)
    "lpm"         LPM()                     longest prefix-cache match first (SGLang)
    "vtc"         VTC()                     fair share across client_id (Sheng et al. 2024)
    "edf"         EDF()                     earliest deadline first, SLO-aware admission
                                            (needs deadline)
"""

from __future__ import annotations

import warnings
from typing import Any

from toolkit.schedulers.deadline import EDF
from toolkit.schedulers.fair_share import VTC
from toolkit.schedulers.policy_base import ADMIT, DEFER, REJECT, Adapted, Policy
from toolkit.types import Request


class FCFS(Policy):
    """First come, first served: arrival time, then insertion order."""

    name = "fcfs"

    def sort_key(self, request: Request) -> Any:
        return (request.arrival_time,)


class Priority(Policy):
    """Lower `priority` value first (vLLM's convention); arrival time breaks ties. With
    aging > 0 a request's effective priority drops by `aging` levels per second since its
    arrival, so a low-priority request cannot starve forever."""

    name = "priority"
    uses_priority = True

    def __init__(self, aging: float = 0.0) -> None:
        if not aging >= 0:
            raise ValueError(f"aging must be >= 0 (priority levels per second waited), got {aging!r}")
        self.aging = float(aging)

    def sort_key(self, request: Request) -> Any:
        if not self.aging:
            return (request.priority, request.arrival_time)
        return (request.priority - self.aging * (self.now() - request.arrival_time), request.arrival_time)

    def __repr__(self) -> str:
        return f"Priority(aging={self.aging})"


class SJF(Policy):
    """Shortest job first: by prompt length ("prompt"), or by the output tokens still
    expected ("output": expected_output_len minus the tokens produced so far)."""

    def __init__(self, by: str = "prompt") -> None:
        if by not in ("prompt", "output"):
            raise ValueError(f"SJF(by=...) must be 'prompt' or 'output', got {by!r}")
        self.by = by
        self.name = "sjf" if by == "prompt" else "sjf_output"
        self.needs = () if by == "prompt" else ("expected_output_len",)

    def sort_key(self, request: Request) -> Any:
        if self.by == "prompt":
            return (request.num_prompt_tokens, request.arrival_time)
        return (max(request.expected_output_len - request.num_output_tokens, 0), request.arrival_time)

    def __repr__(self) -> str:
        return f"SJF(by={self.by!r})"


class LPM(Policy):
    """Longest prefix match first (SGLang's cache-aware policy): waiting requests with the
    most tokens already in the prefix cache are admitted first, so a shared prefix is used
    while it is cached. Running requests keep arrival order. With more than `max_queue`
    waiting requests it falls back to arrival order (the lookups cost a hash chain each)."""

    name = "lpm"

    def __init__(self, max_queue: int = 128) -> None:
        self.max_queue = int(max_queue)

    def sort_key(self, request: Request) -> Any:
        return (request.arrival_time,)

    def admission_key(self, request: Request) -> Any:
        if self.view is None or self.view.num_waiting > self.max_queue:
            return (0, request.arrival_time)
        return (-self.view.kv.num_cached_tokens(request), request.arrival_time)

    def __repr__(self) -> str:
        return f"LPM(max_queue={self.max_queue})"


POLICIES: dict[str, Any] = {
    "fcfs": FCFS, "priority": Priority, "sjf": SJF, "sjf_output": lambda: SJF("output"),
    "lpm": LPM, "vtc": VTC, "edf": EDF,
}


def resolve_policy(policy: str | Policy | Any) -> Policy:
    """A policy instance from a name (see POLICIES), a Policy class or instance, or any
    object with sort_key(request) and victim(running) (wrapped in `Adapted`)."""
    if isinstance(policy, str):
        make = POLICIES.get(policy.lower())
        if make is None:
            raise ValueError(f"unknown policy {policy!r}; valid names: {sorted(POLICIES)} "
                             "(or pass a Policy, or an object with sort_key(request) and victim(running))")
        return make()
    if isinstance(policy, type):
        policy = policy()
    if isinstance(policy, Policy):
        return policy
    if not (callable(getattr(policy, "sort_key", None)) and callable(getattr(policy, "victim", None))):
        raise ValueError(f"policy must be a name in {sorted(POLICIES)}, a Policy, or an object with "
                         f"sort_key(request) and victim(running), got {policy!r}")
    return Adapted(policy)


def policy_of(scheduler: Any) -> Policy | None:
    """The policy a scheduler runs, or None (a scheduler without one)."""
    p = getattr(scheduler, "policy", None)
    return p if isinstance(p, Policy) else None


def warn_ignored_priority(policy: Policy | None, priority: int) -> None:
    """Warn when a priority is given to a policy that does not read it (one message text,
    so Python's default filter shows it once per call site, not once per request)."""
    if priority and policy is not None and not policy.uses_priority:
        warnings.warn(f"policy {policy.name!r} ignores priorities; "
                      "use policy='priority' (or Priority(aging=...)) to serve by priority",
                      UserWarning, stacklevel=3)


__all__ = ["Policy", "FCFS", "Priority", "SJF", "LPM", "VTC", "EDF", "POLICIES", "resolve_policy",
           "policy_of", "warn_ignored_priority", "ADMIT", "DEFER", "REJECT"]
