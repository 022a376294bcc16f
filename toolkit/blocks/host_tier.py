"""HostTier: the bookkeeping of a host (CPU) pool of KV blocks. Integers only.

The pool has `num_slots` slots, each the size of one device KV block (the tensors are
toolkit/blocks/host_kv.py's). A slot is free, or holds one of:
- a **cached** block: a block the device prefix cache evicted, keyed by its chain hash
  (toolkit/blocks/hashing.py; the radix tree's blocks have the same hashes, so a host hit
  rests on the BLAKE2b-128 bound even behind the radix tree, whose device hits compare
  tokens), kept in an LRU and handed back on a hit (`load`). Inclusive: a hit leaves the entry here, so evicting
  the device copy again costs no copy.
- an **owned** block: part of a swapped-out (preempted) request, never evicted; `free`d
  when the request resumes or finishes.

Policy (blocks/reference.py's `ReferenceHostTier` is the twin; the state machine in
tests/blocks/test_host_tier.py compares them call by call):
- a new slot is the lowest-numbered free slot; when none is free, the least recently used
  cached entry that is not pinned is evicted and its slot reused;
- `store` of a key already held only refreshes it (nothing to copy);
- `load` walks the keys and stops at the first miss; each hit becomes most recently used.

Step pinning (why the copies can be run as two lists): a slot stored or loaded in the
current step, and an owned slot freed in it, stays out of reach until `begin_step`, so in
one step a slot is written by at most one swap-out and is never both written and read. The
KV-cache manager calls `begin_step` when the scheduler starts a new SchedulerOutput.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence


class HostTier:
    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ValueError(f"HostTier num_slots must be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self._free = list(range(num_slots))               # heap of free slots
        self._lru: OrderedDict[int, int] = OrderedDict()  # cached key -> slot, LRU first
        self._key_of: dict[int, int] = {}                 # cached slot -> key
        self._owned: set[int] = set()                     # slots of swapped-out requests
        self._pinned: set[int] = set()                    # stored / loaded this step
        self._pending: list[int] = []                     # owned slots freed this step
        self._pinned_cached = 0                           # cached slots among _pinned
        # counters (blocks): stored = copies to host, loaded = hits copied back, evicted =
        # cached entries dropped for space, dropped = evictions that found no slot
        self.num_stored = self.num_loaded = self.num_evicted = self.num_dropped = 0

    # -- read-only --
    def num_free_slots(self) -> int:
        """Slots a `store` / `allocate` can take now (free + evictable cached)."""
        return len(self._free) + len(self._key_of) - self._pinned_cached

    def num_cached(self) -> int:
        return len(self._lru)

    def num_owned(self) -> int:
        return len(self._owned)

    def num_pending(self) -> int:
        return len(self._pending)

    def __contains__(self, key: int) -> bool:
        return key in self._lru

    def peek(self, keys: Sequence[int]) -> int:
        """How many leading keys are cached (nothing changes)."""
        n = 0
        for k in keys:
            if k not in self._lru:
                break
            n += 1
        return n

    # -- the step --
    def begin_step(self) -> None:
        """The last step's copies are enqueued: its pins end, its freed slots become free."""
        self._pinned.clear()
        self._pinned_cached = 0
        for s in self._pending:
            heapq.heappush(self._free, s)
        self._pending.clear()

    # -- cache of evicted device blocks --
    def store(self, key: int) -> int | None:
        """The slot to copy a block with this key into, or None: the key is cached already
        (refreshed, nothing to copy) or no slot can be had this step (the block is dropped)."""
        if key in self._lru:
            self._lru.move_to_end(key)
            return None
        slot = self._take()
        if slot is None:
            self.num_dropped += 1
            return None
        self._lru[key] = slot
        self._key_of[slot] = key
        self._pinned.add(slot)
        self._pinned_cached += 1
        self.num_stored += 1
        return slot

    def load(self, keys: Sequence[int]) -> list[int]:
        """Slots of the leading cached keys (each refreshed and pinned for this step)."""
        out = []
        for k in keys:
            slot = self._lru.get(k)
            if slot is None:
                break
            self._lru.move_to_end(k)
            if slot not in self._pinned:
                self._pinned.add(slot)
                self._pinned_cached += 1
            out.append(slot)
        self.num_loaded += len(out)
        return out

    # -- slots owned by swapped-out requests --
    def allocate(self, n: int) -> list[int] | None:
        """n owned slots (lowest free first, then evicting cached entries), or None when
        fewer can be had; then nothing changed."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"slot count must be a non-negative integer, got {n!r}")
        if n > self.num_free_slots():
            return None
        out = [self._take() for _ in range(n)]
        self._owned.update(out)
        self._pinned.update(out)
        return out

    def free(self, slots: Sequence[int]) -> None:
        """Owned slots back to the pool, from the next step on (their swap-in may be this
        step's)."""
        bad = [s for s in slots if s not in self._owned]
        if bad or len(set(slots)) != len(slots):
            raise ValueError(f"cannot free host slots {list(slots)}: {bad or 'repeated'} not owned; "
                             f"valid: slots returned by allocate, once each")
        self._owned.difference_update(slots)
        self._pending.extend(slots)

    def _take(self) -> int | None:
        if self._free:
            return heapq.heappop(self._free)
        for key, slot in self._lru.items():          # LRU first, skipping this step's pins
            if slot not in self._pinned:
                del self._lru[key]
                del self._key_of[slot]
                self.num_evicted += 1
                return slot
        return None

    def check(self) -> None:
        """Internal invariant (tests): every slot is in exactly one state."""
        free, cached, owned, pending = set(self._free), set(self._key_of), self._owned, set(self._pending)
        parts = [free, cached, owned, pending]
        assert sum(map(len, parts)) == self.num_slots == len(free | cached | owned | pending), parts
        assert len(self._free) == len(free) and len(self._pending) == len(pending)
        assert {self._lru[k] for k in self._lru} == cached and len(self._lru) == len(cached)
        assert self._pinned_cached == len(self._pinned & cached)

    def __repr__(self) -> str:
        return (f"HostTier(slots={self.num_slots}, free={len(self._free)}, cached={len(self._lru)}, "
                f"owned={len(self._owned)}, stored={self.num_stored}, loaded={self.num_loaded}, "
                f"evicted={self.num_evicted})")
