"""Scheduling policies: which waiting request is admitted first, which running one is
preempted when blocks run out.

A policy is two methods. `sort_key(request)` orders admission and the running list
(smaller = served first); schedulers sort with Python's stable sort, so requests with
equal keys keep insertion order. `victim(running)` picks the request to preempt from the
candidates (by default the one served last: the largest key, the latest inserted on ties).

A new policy is a few lines:

    class ShortestPromptFirst(Policy):
        name = "spf"
        def sort_key(self, r): return (r.num_prompt_tokens, r.arrival_time)
"""

from __future__ import annotations

from typing import Any, Sequence

from toolkit.types import Request


class Policy:
    name = "policy"

    def sort_key(self, request: Request) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define sort_key(request)")

    def victim(self, running: Sequence[Request]) -> Request:
        """The candidate served last (stable: the latest inserted among equal keys)."""
        if not running:
            raise ValueError("victim() needs at least one running request to choose from")
        return sorted(running, key=self.sort_key)[-1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FCFS(Policy):
    """First come, first served: arrival time, then insertion order."""

    name = "fcfs"

    def sort_key(self, request: Request) -> Any:
        return (request.arrival_time,)


class Priority(Policy):
    """Lower `priority` value first (vLLM's convention); arrival time breaks ties."""

    name = "priority"

    def sort_key(self, request: Request) -> Any:
        return (request.priority, request.arrival_time)


POLICIES: dict[str, type[Policy]] = {"fcfs": FCFS, "priority": Priority}


def resolve_policy(policy: str | Policy | Any) -> Policy:
    """A policy instance from a name ("fcfs", "priority") or an object with sort_key/victim."""
    if isinstance(policy, str):
        cls = POLICIES.get(policy.lower())
        if cls is None:
            raise ValueError(f"unknown policy {policy!r}; valid names: {sorted(POLICIES)} "
                             "(or pass an object with sort_key(request) and victim(running))")
        return cls()
    if isinstance(policy, type):
        policy = policy()
    if not (callable(getattr(policy, "sort_key", None)) and callable(getattr(policy, "victim", None))):
        raise ValueError(f"policy must be a name in {sorted(POLICIES)} or an object with "
                         f"sort_key(request) and victim(running), got {policy!r}")
    return policy
