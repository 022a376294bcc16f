"""Direct checks of the fast allocators: validation messages, policy corners, reprs."""

from __future__ import annotations

import pytest

from toolkit.blocks.base import BlockAllocator, OutOfBlocks
from toolkit.blocks.free_list import FreeListAllocator
from toolkit.blocks.hashing import hash_blocks
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.render import COLORS

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


def _rich_cells(text) -> list[tuple[str, str]]:
    """(glyph, background color) of every cell of `block_map_rich`'s text, in block order."""
    head, _, body = text.plain.partition("\n")
    start = len(head) + 1
    cells = []
    for row in body.split("\n"):
        for i in range(0, len(row), 3):
            styles = {str(sp.style) for sp in text.spans if sp.start <= start + i < sp.end}
            assert len(styles) == 1, (row, styles)
            cells.append((row[i:i + 3].strip(), styles.pop().removeprefix("black on ")))
        start += len(row) + 1
    return cells


@pytest.mark.parametrize("cls", ALLOCATORS)
def test_reprs_show_the_block_map(cls: type) -> None:
    a = cls(36, 2)                                  # 32 cells a line: two lines of cells
    x = a.allocate(4)
    a.fork([x[1]])                                  # x[1]: ref count 2
    want = {x[0]: ("1", "held"), x[1]: ("2", "shared"), x[2]: ("1", "held"),
            x[3]: ("1", "held")}
    if cls is PrefixCachingAllocator:
        h = hash_blocks(list(range(6)), 2)
        a.publish(x[2], h[0])                       # held and cached
        y = a.allocate(1)[0]
        a.publish(y, h[1])
        a.free([y])                                 # cached, unreferenced: evictable
        want.update({x[2]: ("1", "cached"), y: ("c", "evictable")})
    assert f"free={a.num_free_blocks()}" in repr(a) and "held=4" in repr(a)
    html = a._repr_html_()
    assert html.count('title="block ') == 36 and "ref 2" in html

    text = a.__rich__()
    assert text.plain.split("\n")[0] == repr(a)
    assert [len(row) for row in text.plain.split("\n")[1:] if row] == [32 * 3, 4 * 3]
    cells = _rich_cells(text)
    expected = [(want[b][0], COLORS[want[b][1]]) if b in want else (".", COLORS["free"])
                for b in range(36)]
    assert cells == expected
    assert sum(g == "." for g, _ in cells) == 36 - len(want)
