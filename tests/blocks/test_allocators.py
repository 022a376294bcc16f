"""Direct checks of the fast allocators: validation messages, policy corners, reprs."""

from __future__ import annotations

import pytest

from toolkit.blocks.base import BlockAllocator, OutOfBlocks
from toolkit.blocks.free_list import FreeListAllocator
from toolkit.blocks.hashing import hash_blocks
from toolkit.blocks.prefix_caching import PrefixCachingAllocator

ALLOCATORS = [FreeListAllocator, PrefixCachingAllocator]


@pytest.mark.parametrize("cls", ALLOCATORS)
def test_protocol_and_bad_sizes(cls: type) -> None:
    assert isinstance(cls(4, 2), BlockAllocator)
    for args in [(0, 2), (4, 0), (4.0, 2), (True, 2)]:
        with pytest.raises(ValueError, match="positive integer"):
            cls(*args)


@pytest.mark.parametrize("cls", ALLOCATORS)
def test_over_allocation_and_bad_free_change_nothing(cls: type) -> None:
    a = cls(4, 2)
    x = a.allocate(3)
    with pytest.raises(OutOfBlocks, match="asked for 2 blocks, 1 free"):
        a.allocate(2)
    with pytest.raises(ValueError, match="non-negative integer"):
        a.allocate(-1)
    rest = [b for b in range(4) if b not in x]
    with pytest.raises(ValueError, match="not held"):
        a.free([x[0], rest[0]])
    with pytest.raises(ValueError, match="ref count is 1"):
        a.free([x[1], x[1]])
    assert a.num_free_blocks() == 1 and all(a.ref_count(b) == 1 for b in x)
    a.fork([x[0]])
    a.free([x[0], x[0]] + x[1:])
    assert a.num_free_blocks() == 4


def test_prefix_caching_lru_and_duplicate_publish() -> None:
    a = PrefixCachingAllocator(4, 2)
    h = hash_blocks([1, 2, 3, 4, 5, 6], 2)
    b = a.allocate(3)
    for blk, hh in zip(b, h):
        a.publish(blk, hh)
    dup = a.allocate(1)[0]
    a.publish(dup, h[0])                       # duplicate hash keeps the existing block
    a.free([dup])
    assert a.num_cached_blocks() == 3
    a.free(b[::-1])                            # tail first: the tail is evicted first
    assert a.lookup(h) == b and a.num_free_blocks() == 1
    a.free(b[::-1])
    taken = a.allocate(2)                      # 1 never-cached block, then the LRU tail
    assert taken[1] == b[2] and a.lookup(h) == b[:2]


@pytest.mark.parametrize("cls", ALLOCATORS)
def test_reprs_show_the_block_map(cls: type) -> None:
    a = cls(6, 2)
    a.allocate(2)
    assert "free=4" in repr(a) and "held=2" in repr(a)
    html = a._repr_html_()
    assert html.count("block ") >= 6 and "ref 1" in html
    assert "free" in a.__rich__().plain or "." in a.__rich__().plain
