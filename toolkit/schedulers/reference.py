"""ReferenceScheduler: the simplest correct scheduler (the conformance oracle's twin).

FCFS. A request is admitted, in arrival order, only when the blocks for its whole life
(prompt + max_tokens, capped by max_model_len) are free; they are allocated at once, so
it never needs preemption. Each step every running request gets all its remaining
tokens, in admission order, as far as the token budget goes. No prefix caching, no
speculative tokens, no policy choice.
"""

from __future__ import annotations

from toolkit.schedulers.core import SchedulerCore
from toolkit.types import RequestStatus, SchedulerOutput


class ReferenceScheduler(SchedulerCore):
    supports_async = True    # schedule() reads token counts, never token values

    def __init__(self, allocator, *, block_size: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None) -> None:
        super().__init__(allocator, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_ids=self._drain_finished())
        for req in sorted(self.waiting, key=lambda r: r.arrival_time):
            if len(self.running) >= self.max_num_seqs or not self.kv.allocate_slots(req, self.cap_end(req)):
                break
            req.status = RequestStatus.RUNNING
            self.waiting.remove(req)
            self.running.append(req)
        budget = self.max_num_batched_tokens
        for req in self.running:
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                break
            out.scheduled.append(self._scheduled(req, n))
            budget -= n
        return out
