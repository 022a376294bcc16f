"""PrefixCachingAllocator: hash -> block map with an LRU of unreferenced cached blocks.

It follows the policy written in toolkit/blocks/reference.py exactly (never-cached free
blocks first, then evict least recently freed; free order = eviction order; lookup stops
at the first miss; a duplicate publish keeps the existing block), so the conformance
suite can compare it with the reference step by step.

Collisions: hashes are 128-bit BLAKE2b chains over (parent, tokens, extra key); see
toolkit/blocks/hashing.py for the written bound. A hash match is taken as a token match,
so no tokens are stored here.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.blocks._validate import check_held
from toolkit.blocks.cached_pool import CachedBlockPool


class PrefixCachingAllocator(CachedBlockPool):
    """`_cached`: cached block -> its hash; `_block_of`: hash -> cached block."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._block_of: dict[int, int] = {}                   # hash -> cached block

    def _evict(self, b: int) -> int:
        h = self._cached.pop(b)
        del self._block_of[h]
        return h

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        out = []
        ref, block_of = self._ref, self._block_of
        for h in block_hashes:
            b = block_of.get(h)
            if b is None:
                break
            if ref[b] == 0:
                del self._lru[b]
            ref[b] += 1
            out.append(b)
        return out

    def peek(self, block_hashes: Sequence[int]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self._block_of:
                break
            n += 1
        return n

    def publish(self, block_id: int, block_hash: int) -> None:
        check_held(self._ref, [block_id], "publish")
        if block_hash in self._block_of or block_id in self._cached:
            return                                   # keep the existing block / first hash
        self._cached[block_id] = block_hash
        self._block_of[block_hash] = block_id

    def __repr__(self) -> str:
        held = self.num_blocks - self.num_free_blocks()
        return (f"PrefixCachingAllocator(blocks={self.num_blocks}x{self.block_size}, "
                f"free={self.num_free_blocks()} ({len(self._lru)} evictable cached), "
                f"held={held}, cached={len(self._cached)})")
