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


class ReferenceHostTier:
    """The twin of toolkit/blocks/host_tier.py's HostTier: the same policy, written with
    plain lists and a scan of every slot (see that module for the policy)."""

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ValueError(f"HostTier num_slots must be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self.state: dict[int, str] = {s: "free" for s in range(num_slots)}  # free/cached/owned/pending
        self.cached: list[tuple[int, int]] = []     # (key, slot), least recently used first
        self.pinned: set[int] = set()

    def num_free_slots(self) -> int:
        return sum(1 for s, st in self.state.items()
                   if st == "free" or (st == "cached" and s not in self.pinned))

    def num_cached(self) -> int:
        return len(self.cached)

    def num_owned(self) -> int:
        return sum(1 for st in self.state.values() if st == "owned")

    def __contains__(self, key: int) -> bool:
        return any(k == key for k, _ in self.cached)

    def peek(self, keys: Sequence[int]) -> int:
        n = 0
        for k in keys:
            if k not in self:
                break
            n += 1
        return n

    def begin_step(self) -> None:
        self.pinned = set()
        for s, st in self.state.items():
            if st == "pending":
                self.state[s] = "free"

    def _slot(self, key: int) -> int:
        return next(s for k, s in self.cached if k == key)

    def _touch(self, key: int) -> int:
        s = self._slot(key)
        self.cached.remove((key, s))
        self.cached.append((key, s))
        return s

    def _take(self) -> int | None:
        free = [s for s, st in self.state.items() if st == "free"]
        if free:
            return min(free)
        for k, s in self.cached:
            if s not in self.pinned:
                self.cached.remove((k, s))
                self.state[s] = "free"
                return s
        return None

    def store(self, key: int) -> int | None:
        if key in self:
            self._touch(key)
            return None
        s = self._take()
        if s is None:
            return None
        self.state[s] = "cached"
        self.cached.append((key, s))
        self.pinned.add(s)
        return s

    def load(self, keys: Sequence[int]) -> list[int]:
        out = []
        for k in keys:
            if k not in self:
                break
            s = self._touch(k)
            self.pinned.add(s)
            out.append(s)
        return out

    def allocate(self, n: int) -> list[int] | None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"slot count must be a non-negative integer, got {n!r}")
        if n > self.num_free_slots():
            return None
        out = []
        for _ in range(n):
            s = self._take()
            self.state[s] = "owned"
            self.pinned.add(s)
            out.append(s)
        return out

    def free(self, slots: Sequence[int]) -> None:
        if len(set(slots)) != len(slots) or any(self.state.get(s) != "owned" for s in slots):
            raise ValueError(f"cannot free host slots {list(slots)}: not owned")
        for s in slots:
            self.state[s] = "pending"
