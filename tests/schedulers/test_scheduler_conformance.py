"""Every scheduler here passes the public conformance suite (toolkit.testing.check_scheduler)."""

from __future__ import annotations

import pytest

from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.reference import ReferenceAllocator
from toolkit.schedulers import ContinuousBatchingScheduler, ReferenceScheduler, StaticBatchingScheduler
from toolkit.testing import check_scheduler

ALLOCATORS = {
    "reference": lambda n, bs: ReferenceAllocator(n, bs, prefix_caching=True),
    "prefix_caching": PrefixCachingAllocator,
}


def continuous(**kw):
    return lambda a, bs, seqs, budget: ContinuousBatchingScheduler(
        a, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=budget, **kw)


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "noprefix"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_continuous(policy: str, prefix: bool, chunked: bool, allocator: str) -> None:
    check_scheduler(continuous(policy=policy, enable_prefix_caching=prefix, enable_chunked_prefill=chunked),
                    allocator_factory=ALLOCATORS[allocator], prompts_within_budget=not chunked)


def test_continuous_lookahead() -> None:
    check_scheduler(continuous(num_lookahead_tokens=3))


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_static(allocator: str) -> None:
    check_scheduler(lambda a, bs, seqs, budget: StaticBatchingScheduler(
        a, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=budget), allocator_factory=ALLOCATORS[allocator])


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_reference(allocator: str) -> None:
    check_scheduler(lambda a, bs, seqs, budget: ReferenceScheduler(
        a, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=budget), allocator_factory=ALLOCATORS[allocator])
