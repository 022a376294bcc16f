"""StaticBatchingScheduler: the baseline that batches like plain Hugging Face `generate`.

Up to max_num_seqs waiting requests form a fixed batch; it is prefilled (whole prompts
when the token budget permits, else in chunks) and decoded until every member has
finished; only then is the next batch admitted. A member is admitted only if the blocks
for its whole life (prompt + max_tokens, capped by max_model_len) are free on top of the
other members' reservations, so the batch never runs out of blocks: no preemption, no
deadlock. No prefix caching and no speculative tokens (drafts are not scheduled).
"""

from __future__ import annotations

from typing import Any

from toolkit.schedulers.core import SchedulerCore
from toolkit.schedulers.policies import Policy, resolve_policy
from toolkit.schedulers.view import SchedulerView
from toolkit.types import Request, RequestStatus, SchedulerOutput


class StaticBatchingScheduler(SchedulerCore):
    supports_async = True    # schedule() reads token counts, never token values

    def __init__(self, allocator, *, block_size: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                 policy: str | Policy | Any = "fcfs") -> None:
        super().__init__(allocator, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
        self.policy = resolve_policy(policy)      # its order only (admission is all or nothing here)
        self._view = SchedulerView(self)
        self.policy.bind(self._view)

    def add_request(self, request: Request) -> None:
        self.policy.check(request)
        super().add_request(request)

    def reserved_blocks(self, request: Request) -> int:
        """Blocks for every position the request may ever compute."""
        return self.blocks_for(self.cap_end(request))

    def schedule(self) -> SchedulerOutput:
        self._tick()
        if self.policy.view is not self._view:       # bound by another scheduler since
            self.policy.bind(self._view)
        out = SchedulerOutput(finished_ids=self._drain_finished())
        if not self.running:
            self._admit_batch()
        budget = self.max_num_batched_tokens
        for req in self.running:
            if budget <= 0:
                break
            end = min(req.num_tokens, req.num_computed_tokens + budget)
            if req.prefill_whole and end < req.num_tokens:
                break                                # its prompt in one step, or wait for one
            ok = self.kv.allocate_slots(req, end)   # reserved at admission: cannot run short
            assert ok, "a static batch member ran out of its reserved blocks"
            out.scheduled.append(self._scheduled(req, end - req.num_computed_tokens))
            budget -= end - req.num_computed_tokens
        return out

    def _admit_batch(self) -> None:
        free = self.kv.num_free_blocks()
        for req in sorted(self.waiting, key=self.policy.sort_key):
            if len(self.running) >= self.max_num_seqs or self.reserved_blocks(req) > free:
                break
            free -= self.reserved_blocks(req)
            req.status = RequestStatus.RUNNING
            self.waiting.remove(req)
            self.running.append(req)
