"""ReferenceAllocator: the obviously-correct twin of the block allocators (the oracle).

Policy, which every allocator that claims prefix caching must follow so that the
conformance suite can compare them step by step:
- `allocate` takes never-cached free blocks first (lowest id first here, any order is
  allowed), and only then evicts unreferenced cached blocks, least recently freed first.
- `free` decrements ref counts in the order given; a block whose count reaches 0 becomes
  free, or, if it is published, evictable at the most-recently-used end, in that order.
- `lookup` walks the hashes and stops at the first miss; every hit gains a reference.
- `publish` of a hash that another block already holds keeps the existing block.
Everything is validated before anything changes.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from toolkit.blocks.base import OutOfBlocks


def check_count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"block count must be a non-negative integer, got {n!r}")
    return n


class ReferenceAllocator:
    num_reserved = 0

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self.ref: dict[int, int] = {}                 # held block -> ref count (> 0)
        self.free_set: set[int] = set(range(num_blocks))  # free, never cached (or hash dropped)
        self.evictable: list[int] = []                # unreferenced cached blocks, LRU first
        self.hash_of: dict[int, int] = {}             # cached block -> hash
        self.block_of: dict[int, int] = {}            # hash -> cached block

    def num_free_blocks(self) -> int:
        return len(self.free_set) + len(self.evictable)

    def allocate(self, n: int) -> list[int]:
        check_count(n)
        if n > self.num_free_blocks():
            raise OutOfBlocks(f"asked for {n} blocks, {self.num_free_blocks()} free")
        out = []
        for _ in range(n):
            if self.free_set:
                b = min(self.free_set)
                self.free_set.remove(b)
            else:
                b = self.evictable.pop(0)
                del self.block_of[self.hash_of.pop(b)]
            self.ref[b] = 1
            out.append(b)
        return out

    def _check_held(self, block_ids: Sequence[int], what: str) -> None:
        for b, c in Counter(block_ids).items():
            if self.ref.get(b, 0) < (c if what == "free" else 1):
                raise ValueError(f"cannot {what} block {b}: it is not held "
                                 f"(ref count {self.ref.get(b, 0)}, asked {c})")

    def free(self, block_ids: Sequence[int]) -> None:
        self._check_held(block_ids, "free")
        for b in block_ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                if b in self.hash_of:
                    self.evictable.append(b)
                else:
                    self.free_set.add(b)

    def fork(self, block_ids: Sequence[int]) -> None:
        self._check_held(block_ids, "fork")
        for b in block_ids:
            self.ref[b] += 1

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        if not self.prefix_caching:
            return []
        out = []
        for h in block_hashes:
            b = self.block_of.get(h)
            if b is None:
                break
            if b in self.ref:
                self.ref[b] += 1
            else:
                self.evictable.remove(b)
                self.ref[b] = 1
            out.append(b)
        return out

    def peek(self, block_hashes: Sequence[int]) -> int:
        """How many leading hashes lookup would hit now; nothing changes."""
        if not self.prefix_caching:
            return 0
        n = 0
        for h in block_hashes:
            if h not in self.block_of:
                break
            n += 1
        return n

    def publish(self, block_id: int, block_hash: int) -> None:
        if self.ref.get(block_id, 0) < 1:
            raise ValueError(f"cannot publish block {block_id}: it is not held")
        if not self.prefix_caching or block_hash in self.block_of or block_id in self.hash_of:
            return
        self.hash_of[block_id] = block_hash
        self.block_of[block_hash] = block_id

    # -- introspection used by the conformance suite and notebooks --
    def ref_count(self, block_id: int) -> int:
        return self.ref.get(block_id, 0)

    def num_cached_blocks(self) -> int:
        return len(self.hash_of)
