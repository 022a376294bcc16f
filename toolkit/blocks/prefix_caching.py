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

from collections import OrderedDict
from collections.abc import Sequence

from toolkit.blocks._validate import check_count, check_held, check_size
from toolkit.blocks.base import OutOfBlocks


class PrefixCachingAllocator:
    num_reserved = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_size("num_blocks", num_blocks)
        self.block_size = check_size("block_size", block_size)
        self._ref = [0] * num_blocks                          # [num_blocks] ref counts
        self._free = list(range(num_blocks - 1, -1, -1))      # never-cached free blocks (stack)
        self._lru: OrderedDict[int, None] = OrderedDict()     # evictable cached blocks, LRU first
        self._hash_of: dict[int, int] = {}                    # cached block -> hash
        self._block_of: dict[int, int] = {}                   # hash -> cached block

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
            del self._block_of[self._hash_of.pop(b)]
            out.append(b)
        ref = self._ref
        for b in out:
            ref[b] = 1
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "free")
        ref, hash_of = self._ref, self._hash_of
        for b in block_ids:
            ref[b] -= 1
            if ref[b] == 0:
                if b in hash_of:
                    self._lru[b] = None              # most recently used end
                else:
                    self._free.append(b)

    def fork(self, block_ids: Sequence[int]) -> None:
        check_held(self._ref, block_ids, "fork")
        for b in block_ids:
            self._ref[b] += 1

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
        if block_hash in self._block_of or block_id in self._hash_of:
            return                                   # keep the existing block / first hash
        self._hash_of[block_id] = block_hash
        self._block_of[block_hash] = block_id

    # -- introspection (conformance suite, notebooks) --
    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id] if 0 <= block_id < self.num_blocks else 0

    def num_cached_blocks(self) -> int:
        return len(self._hash_of)

    def cached_blocks(self) -> frozenset[int]:
        return frozenset(self._hash_of)

    def __repr__(self) -> str:
        held = self.num_blocks - self.num_free_blocks()
        return (f"PrefixCachingAllocator(blocks={self.num_blocks}x{self.block_size}, "
                f"free={self.num_free_blocks()} ({len(self._lru)} evictable cached), "
                f"held={held}, cached={len(self._hash_of)})")

    def _repr_html_(self) -> str:
        from toolkit.blocks.render import block_map_html
        return block_map_html(self)

    def __rich__(self):  # -> rich.console.RenderableType
        from toolkit.blocks.render import block_map_rich
        return block_map_rich(self)
