"""SiblingQueue: n > 1 samples of one prompt, started on the first sample's blocks.

Samples 1.. of a request wait here until sample 0 has computed its prompt; then the
scheduler forks them onto its prompt blocks (ref += 1; they compute only the last prompt
token, whose block is copied on write). A scheduler that declares supports_fork = False,
or a fork refused for now (full batch; the leader preempted or finished), adds the sample as
a new request: it then shares the prompt's full blocks through the prefix cache.
"""

from __future__ import annotations

from typing import Iterable

from toolkit.types import Request


class SiblingQueue:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.can_fork = bool(getattr(scheduler, "supports_fork", False))   # declared, read once
        self._held: list[tuple[Request, Request]] = []    # (sample, the leader it waits for)

    def hold(self, request: Request, leader: Request) -> None:
        self._held.append((request, leader))

    def release(self) -> None:
        """Samples whose leader has computed its prompt (or finished) join the scheduler."""
        go = [p for p in self._held if _ready(p[1])]
        if not go:
            return
        self._held = [p for p in self._held if not _ready(p[1])]
        for k, (req, lead) in enumerate(go):     # one pass, O(held): n samples release at once
            try:
                if lead.is_finished or not self.can_fork or not self.scheduler.fork(req, lead):
                    self.scheduler.add_request(req)
            except BaseException:                # this one is out (never seen twice); the rest wait
                self._held.extend(go[k + 1:])
                raise

    def remove(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        self._held = [(r, lead) for r, lead in self._held if r.request_id not in ids]

    def __len__(self) -> int:
        return len(self._held)


def _ready(lead: Request) -> bool:
    return lead.is_finished or lead.num_computed_tokens >= lead.num_prompt_tokens - 1
