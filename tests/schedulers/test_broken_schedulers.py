"""The conformance suite must fail deliberately broken schedulers (so it can fail at all)."""

from __future__ import annotations

from typing import Iterable

import pytest
from hypothesis import Phase, settings

from toolkit.blocks.hashing import hash_blocks
from toolkit.schedulers import ContinuousBatchingScheduler
from toolkit.schedulers.core import SchedulerCore
from toolkit.testing import check_scheduler
from toolkit.types import Request, RequestStatus, SchedulerOutput


class LeaksOnAbort(ContinuousBatchingScheduler):
    def abort(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            r = self.requests.get(rid)
            if r is not None:
                r.block_ids = []              # forgets the blocks instead of freeing them
        super().abort(request_ids)


class StaleTableOnPreemption(ContinuousBatchingScheduler):
    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        table = list(req.block_ids)
        super()._preempt(req, out)
        req.block_ids = table                 # still points at the blocks it just freed


class HitsTheLastToken(ContinuousBatchingScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        bs = self.block_size        # looks up every full block, the last token's included
        self.kv._lookup_hashes = lambda req: hash_blocks(req.all_token_ids, bs, req.cache_salt)


class NoEOS(ContinuousBatchingScheduler):
    def update(self, out, sampled):
        for s in out.scheduled:
            s.request.eos_token_id = None
        return super().update(out, sampled)


class NeverRollsBack(ContinuousBatchingScheduler):
    def _update_one(self, s, tokens):
        res = super()._update_one(s, tokens)
        if not s.request.status.finished and s.samples:
            s.request.num_computed_tokens = s.end - 1     # rejected drafts counted as computed
        return res


class ForgetsIgnored(ContinuousBatchingScheduler):
    def add_request(self, request: Request) -> None:
        super().add_request(request)
        self._ignored.pop(request.request_id, None)    # never reports the rejection


class Unfair(ContinuousBatchingScheduler):
    """Always admits the newest request first and never lets the oldest finish when others wait."""

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if len(self.requests) > 1 and out.scheduled:
            oldest = min(self.requests.values(), key=lambda r: r.arrival_time)
            out.scheduled = [s for s in out.scheduled if s.request is not oldest] or out.scheduled[:0]
        return out


def factory(cls, budget_extra: int = 0, seq_extra: int = 0):
    return lambda a, bs, seqs, budget: cls(a, block_size=bs, max_num_seqs=seqs + seq_extra,
                                           max_num_batched_tokens=budget + budget_extra)


BROKEN = {
    "over_budget": factory(ContinuousBatchingScheduler, budget_extra=2),
    "over_max_num_seqs": factory(ContinuousBatchingScheduler, seq_extra=1),
    "leaks_on_abort": factory(LeaksOnAbort),
    "stale_table_on_preemption": factory(StaleTableOnPreemption),
    "prefix_hit_on_last_token": factory(HitsTheLastToken),
    "ignores_eos": factory(NoEOS),
    "forgets_ignored": factory(ForgetsIgnored),
    "never_rolls_back_drafts": factory(NeverRollsBack),
    "starves_the_oldest": factory(Unfair),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_suite_catches_broken_scheduler(name: str) -> None:
    quick = settings(max_examples=200, stateful_step_count=30, deadline=None, database=None,
                     phases=[Phase.explicit, Phase.generate])       # no shrinking: just find it
    with pytest.raises(AssertionError):
        check_scheduler(BROKEN[name], settings=quick)


def test_core_alone_is_not_a_scheduler() -> None:
    assert not hasattr(SchedulerCore, "schedule")
    assert RequestStatus.FINISHED_IGNORED.finish_reason == "rejected"
