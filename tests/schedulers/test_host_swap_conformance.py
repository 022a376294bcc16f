"""The scheduler conformance machine (toolkit.testing.check_scheduler) with the host tier on:
device evictions copied to host slots and back on hits, swap preemption, aborts, on a tiny
device pool; every step's fake KV goes through the copies (a missed or wrong swap-in shows
up as a computed position holding the wrong token) and no device block or host slot leaks."""

from __future__ import annotations

import pytest
from hypothesis import settings

from toolkit.blocks.host_tier import HostTier
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.radix import RadixAllocator
from toolkit.schedulers import ContinuousBatchingScheduler
from toolkit.testing import check_scheduler

ALLOCATORS = {"prefix_caching": PrefixCachingAllocator, "radix": RadixAllocator}


@pytest.mark.parametrize("case", ["hash+swap", "radix+swap", "hash+recompute", "noprefix+swap"])
def test_host_tier_storms(case: str) -> None:
    made: list[ContinuousBatchingScheduler] = []
    alloc, preemption = case.split("+")
    prefix = alloc != "noprefix"

    def factory(a, bs, seqs, budget):
        s = ContinuousBatchingScheduler(a, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=budget,
                                        enable_prefix_caching=prefix, host_tier=HostTier(6),
                                        preemption=preemption)
        made.append(s)
        return s

    check_scheduler(factory, allocator_factory=ALLOCATORS.get(alloc, PrefixCachingAllocator),
                    settings=settings(max_examples=20, stateful_step_count=30, deadline=None))
    host = [s.kv.host for s in made]
    if preemption == "swap":
        assert sum(s.kv.num_swap_preemptions for s in made) > 0, "no request was swapped out"
        assert sum(s.kv.num_swapped_in for s in made) > 0, "nothing came back from the host"
    if prefix:
        assert sum(h.num_stored for h in host) > 0 and sum(h.num_loaded for h in host) > 0, \
            "no evicted block went to the host and came back"
