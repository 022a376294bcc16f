"""Both allocators (and the reference itself) pass the conformance suite; broken ones fail it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import pytest

from toolkit.blocks.free_list import FreeListAllocator
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.reference import ReferenceAllocator
from toolkit.testing import check_allocator

PASS = {"max_examples": 100}              # passing runs are cheap (~1 ms a step)
FAIL = {"max_examples": 300, "shrink": False}  # stops at the first failure; shrinking is slow


def test_reference_passes() -> None:
    check_allocator(ReferenceAllocator, **PASS)


def test_reference_without_prefix_caching_passes() -> None:
    check_allocator(lambda n, bs: ReferenceAllocator(n, bs, prefix_caching=False), prefix_caching=False,
                    **PASS)


def test_prefix_caching_allocator_passes() -> None:
    check_allocator(PrefixCachingAllocator, **PASS)


def test_prefix_caching_allocator_passes_bigger_blocks() -> None:
    check_allocator(PrefixCachingAllocator, num_blocks=7, block_size=3, **PASS)


def test_free_list_allocator_passes() -> None:
    check_allocator(FreeListAllocator, prefix_caching=False, **PASS)


# -- deliberately broken allocators: each must make the suite fail --

class _PopsNewest(OrderedDict):
    def popitem(self, last: bool = True):  # type: ignore[override]
        return super().popitem(last=True)


class EvictsMostRecent(PrefixCachingAllocator):
    """LRU inverted: evicts the most recently freed cached block."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._lru = _PopsNewest()


class FreeWithoutValidation(FreeListAllocator):
    """Frees the held ids of a bad list and silently skips the rest."""

    def free(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            if 0 <= b < self.num_blocks and self._ref[b] > 0:
                self._ref[b] -= 1
                if self._ref[b] == 0:
                    self._free.append(b)


class PublishReplaces(PrefixCachingAllocator):
    """A duplicate hash moves to the newly published block."""

    def publish(self, block_id: int, block_hash: int) -> None:
        old = self._block_of.get(block_hash)
        if old is not None and old != block_id and block_id not in self._cached:
            del self._cached[old]
            if self._ref[old] == 0:
                del self._lru[old]
                self._free.append(old)
            del self._block_of[block_hash]
        super().publish(block_id, block_hash)


class LookupOnlyFirstBlock(PrefixCachingAllocator):
    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        return super().lookup(block_hashes[:1])

    def peek(self, block_hashes: Sequence[int]) -> int:
        return super().peek(block_hashes[:1])


class PeekMisses(PrefixCachingAllocator):
    def peek(self, block_hashes: Sequence[int]) -> int:
        return 0


class CachesNothing(FreeListAllocator):
    """A plain allocator claiming prefix caching."""


@pytest.mark.parametrize("broken, why", [
    (EvictsMostRecent, "evicted the least recently freed"),
    (PublishReplaces, "allocate took block|lookup hit|num_cached_blocks"),   # the dropped duplicate shows first
    (LookupOnlyFirstBlock, "lookup hit 1 blocks"),
    (PeekMisses, "peek said"),
    (CachesNothing, "num_cached_blocks|lookup hit"),
])
def test_broken_prefix_caching_allocator_fails(broken: type, why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        check_allocator(broken, **FAIL)


def test_free_without_validation_fails() -> None:
    with pytest.raises(AssertionError, match="did not raise ValueError|changed"):
        check_allocator(FreeWithoutValidation, prefix_caching=False, **FAIL)


def test_prefix_caching_allocator_fails_the_no_caching_suite() -> None:
    with pytest.raises(AssertionError, match="num_cached_blocks|lookup hit"):
        check_allocator(PrefixCachingAllocator, prefix_caching=False, **FAIL)
