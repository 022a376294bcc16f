"""CachedBlockPool: the block pool both prefix caches share (hash chain, radix tree).

Ref counts, a stack of never-cached free blocks, and an LRU of unreferenced cached blocks,
following the policy of toolkit/blocks/reference.py: fresh blocks first, then evict the
least recently freed; free order = eviction order. A subclass keeps its cache in
`self._cached` (cached block -> its key: a hash, a tree node) and says in `_evict(b)` how a
block leaves it (returning the block's chain hash).

Evictions are reported (`reports_evictions`, blocks/base.py): when `on_evict` is set, it is
called with (block id, block hash) of each cached block just before it is reused, which is
how the KV-cache manager moves evicted blocks to its host tier without either prefix cache
knowing about one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Callable

from toolkit.blocks._validate import check_count, check_held, check_size
from toolkit.blocks.base import OutOfBlocks


class CachedBlockPool:
    num_reserved = 0
    reports_evictions = True
    on_evict: Callable[[int, int], None] | None = None    # (block id, block hash); set by the caller

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_size("num_blocks", num_blocks)
        self.block_size = check_size("block_size", block_size)
        self._ref = [0] * num_blocks                          # [num_blocks] ref counts
        self._free = list(range(num_blocks - 1, -1, -1))      # never-cached free blocks (stack)
        self._lru: OrderedDict[int, None] = OrderedDict()     # evictable cached blocks, LRU first
        self._cached: dict[int, Any] = {}                     # cached block -> its key

    def _evict(self, b: int) -> int:
        """Block b leaves the cache (it is about to be reused); returns its chain hash."""
        raise NotImplementedError

    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._lru)

    def allocate(self, n: int) -> list[int]:
        check_count(n)
        avail = self.num_free_blocks()
        if n > avail:
            raise OutOfBlocks(f"asked for {n} blocks, {avail} free (of {self.num_blocks}, "
                              f"{len(self._lru)} of them evictable cached); ask for at most {avail}")
        k = min(n, len(self._free))                # fresh blocks first
        out = self._free[len(self._free) - k:] if k else []
        del self._free[len(self._free) - k:]
        out.reverse()
        for _ in range(n - k):                      # then evict, least recently freed first
            b, _ = self._lru.popitem(last=False)
            h = self._evict(b)
            if self.on_evict is not None:
                self.on_evict(b, h)
            out.append(b)
        ref = self._ref
        for b in out:
            ref[b] = 1
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "free")
        ref, cached = self._ref, self._cached
        for b in block_ids:
            ref[b] -= 1
            if ref[b] == 0:
                if b in cached:
                    self._lru[b] = None              # most recently used end
                else:
                    self._free.append(b)

    def fork(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "fork")
        for b in block_ids:
            self._ref[b] += 1

    # -- introspection (conformance suite, notebooks) --
    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id] if 0 <= block_id < self.num_blocks else 0

    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def cached_blocks(self) -> frozenset[int]:
        return frozenset(self._cached)

    def _repr_html_(self) -> str:
        from toolkit.blocks.render import block_map_html
        return block_map_html(self)

    def __rich__(self):  # -> rich.console.RenderableType
        from toolkit.blocks.render import block_map_rich
        return block_map_rich(self)
