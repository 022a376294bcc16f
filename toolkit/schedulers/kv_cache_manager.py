"""KVCacheManager: the blocks of requests, between a scheduler and its BlockAllocator.

The allocator deals in integers and never sees a request; a scheduler decides who runs and
how many tokens. This object is what lies between: it knows a request's block table, its
hash chain (prefix caching) and how many of its blocks are published, and turns "give
request r room for positions [0, end)" into allocator calls.

    kv = KVCacheManager(allocator, block_size=16, enable_prefix_caching=True)
    hits = kv.computed_blocks(req)            # prefix-cache hit, references taken
    if not kv.allocate_slots(req, end, limit=..., hits=hits, out=out): ...   # changes nothing
    kv.publish(req)                           # after the step: full blocks become reusable
    kv.free(req)                              # finished or preempted

Read-only queries (`num_free_blocks`, `num_cached_blocks`, `num_cached_tokens`) let a policy
look at the cache without taking references.

Sharing (n > 1): `fork(child, parent, n)` gives a sibling the parent's first blocks
(ref += 1); before a request writes into a block someone else holds, `allocate_slots` swaps
it for a private copy (`SchedulerOutput.blocks_to_copy`, copied on the device before the
step's forward).

Host tier (optional, `host_tier=` a blocks/host_tier.HostTier): the manager composes it with
any allocator that reports evictions (blocks/base.py), so neither prefix cache knows of it.
- A cached block the device evicts goes to a host slot (`SchedulerOutput.blocks_to_swap_out`)
  instead of being dropped; at admission, after the device hits, `admission_hits` continues
  the prefix in the host tier, and `allocate_slots` copies those blocks back into fresh
  device blocks (`blocks_to_swap_in`) and publishes them on the device at once.
- Swap preemption: `swap_out(req, out)` copies a preempted request's computed blocks to
  owned host slots and frees its device blocks; when it is admitted again the slots come
  back (after whatever prefix the device cache still holds). False when the host pool has
  no room: the scheduler then preempts by recompute.
The copies are recorded while `schedule()` runs: the scheduler brackets it with
`begin_step(out)` / `end_step()`; an eviction outside that bracket is dropped, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from toolkit.blocks.hashing import NONE_HASH, hash_blocks
from toolkit.types import Request, SchedulerOutput


@dataclass
class PrefixHit:
    """What an admission starts from (`KVCacheManager.admission_hits`)."""

    blocks: list[int]                 # device blocks of the cached prefix, a reference taken on each
    num_computed_tokens: int          # tokens computed once the hit is taken (device + host)
    host_keys: list[int] = field(default_factory=list)   # host-cached blocks after `blocks`

    def __len__(self) -> int:         # device blocks (what `release` gives back)
        return len(self.blocks)


class KVCacheManager:
    def __init__(self, allocator, *, block_size: int, enable_prefix_caching: bool = False,
                 num_lookahead_tokens: int = 0, host_tier=None) -> None:
        if allocator.block_size != block_size:
            raise ValueError(f"block_size={block_size} differs from the allocator's "
                             f"block_size={allocator.block_size}; pass the same value")
        if not isinstance(num_lookahead_tokens, int) or num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be an integer >= 0, got {num_lookahead_tokens!r}")
        self.allocator = allocator
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.num_lookahead_tokens = num_lookahead_tokens
        self.keyed_by_tokens = bool(getattr(allocator, "keyed_by_tokens", False))
        # usable blocks: what the cache can give one request when it runs alone
        self.capacity_blocks = allocator.num_blocks - allocator.num_reserved
        self._hashes: dict[str, list[int]] = {}     # block hash chain of each live request
        self._published: dict[str, int] = {}        # leading blocks already published
        self.host = host_tier
        self._swapped: dict[str, tuple[list[int], int]] = {}   # swapped out: (host slots, computed tokens)
        self._out: SchedulerOutput | None = None    # the step being scheduled (copies go there)
        # counters: blocks copied to / from the host, requests swapped out / resumed from it
        self.num_swapped_out = self.num_swapped_in = self.num_swap_preemptions = 0
        if host_tier is not None and self.enable_prefix_caching:
            if not getattr(allocator, "reports_evictions", False):
                raise ValueError(f"a host tier with prefix caching needs an allocator that reports "
                                 f"evictions (reports_evictions = True: 'prefix_caching', 'radix'); "
                                 f"{type(allocator).__name__} does not")
            allocator.on_evict = self._on_evict

    # -- read-only --
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks()

    def num_cached_blocks(self) -> int:
        return self.allocator.num_cached_blocks()

    def num_used_blocks(self) -> int:
        return self.allocator.num_blocks - self.allocator.num_free_blocks()

    def num_cached_tokens(self, req: Request) -> int:
        """Leading tokens of `req` a prefix-cache lookup would hit now (no references taken)."""
        if not self.enable_prefix_caching:
            return 0
        return self.allocator.peek(self._lookup_hashes(req), **self._token_key(req)) * self.block_size

    # -- admission --
    def computed_blocks(self, req: Request) -> list[int]:
        """The cached blocks of req's longest cached prefix, a reference taken on each (give
        them to allocate_slots, or back with release). Never the block of the last token: one
        token must be computed for its logits."""
        if not self.enable_prefix_caching:
            return []
        return self.allocator.lookup(self._lookup_hashes(req), **self._token_key(req))

    def admission_hits(self, req: Request) -> PrefixHit:
        """computed_blocks, continued: the device hits, then (host tier) the blocks after them
        that the host holds (copied back by allocate_slots), or, for a swapped-out request,
        its own computed tokens. Give it to allocate_slots, or back with release."""
        blocks = self.computed_blocks(req)
        computed = len(blocks) * self.block_size
        swapped = self._swapped.get(req.request_id)
        if swapped is not None:
            return PrefixHit(blocks, max(computed, swapped[1]))
        keys: list[int] = []
        if self.host is not None and self.enable_prefix_caching:
            rest = self._lookup_hashes(req)[len(blocks):]
            keys = rest[:self.host.peek(rest)]
        return PrefixHit(blocks, computed + len(keys) * self.block_size, keys)

    def release(self, hits: Sequence[int] | PrefixHit) -> None:
        """Give back hits that allocate_slots did not take."""
        if isinstance(hits, PrefixHit):
            hits = hits.blocks
        if hits:
            self.allocator.free(list(reversed(hits)))

    def _token_key(self, req: Request) -> dict:
        """lookup/peek's token arguments for an allocator keyed by tokens (blocks/base.py)."""
        if not self.keyed_by_tokens:
            return {}
        return {"tokens": req.all_token_ids, "extra": req.cache_salt}

    def _lookup_hashes(self, req: Request) -> list[int]:
        return self._block_hashes(req, (req.num_tokens - 1) // self.block_size)

    # -- growth --
    def allocate_slots(self, req: Request, end: int, *, limit: int | None = None,
                       hits: Sequence[int] | PrefixHit | None = None,
                       out: SchedulerOutput | None = None) -> bool:
        """Make req's block table cover positions [0, end) plus the lookahead (never past
        `limit`, the last position it may ever compute). `hits` (from computed_blocks or
        admission_hits) become its first blocks when it holds none; a PrefixHit's host blocks
        (or a swapped-out request's) are copied back into fresh blocks after them. A block
        req will write next that another request also holds is replaced by a private copy
        (recorded in out.blocks_to_copy). False when too few blocks are free; then nothing
        changed (hits are still the caller's)."""
        back: list[int] = []             # host slots / keys of blocks copied back after the hits
        swapped = None
        if isinstance(hits, PrefixHit):
            swapped = self._swapped.get(req.request_id) if not req.block_ids else None
            back = hits.host_keys if swapped is None else swapped[0][len(hits.blocks):]
            hits = hits.blocks
        if hits:
            assert not req.block_ids, "hits are for a request that holds no blocks"
        alloc_end = end + self.num_lookahead_tokens
        if limit is not None:
            alloc_end = min(alloc_end, max(end, limit))
        fresh = bool(hits or back)
        held = len(hits) + len(back) if fresh else len(req.block_ids)
        shared = None if fresh else self._shared_write_block(req)
        grow = -(-alloc_end // self.block_size) - held        # blocks_for(alloc_end) - held
        if grow <= 0:
            if shared is None and not fresh:
                return True            # the common decode step: its block is there already
            grow = 0
        if grow + len(back) + (shared is not None) > self.allocator.num_free_blocks():
            return False
        if hits:
            req.block_ids = list(hits)
            self._published[req.request_id] = len(hits)
        if back:
            self._swap_in(req, back, swapped is None, out)
        if swapped is not None:
            self.host.free(swapped[0])           # reusable from the next step (swap-ins run first)
            del self._swapped[req.request_id]
        if shared is not None:
            (new,) = self.allocator.allocate(1)
            assert out is not None, "a copy-on-write needs the SchedulerOutput to record the copy"
            out.blocks_to_copy.append((req.block_ids[shared], new))
            self.allocator.free([req.block_ids[shared]])
            req.block_ids[shared] = new
        if grow:
            req.block_ids.extend(self.allocator.allocate(grow))
        return True

    def _swap_in(self, req: Request, back: list[int], cached: bool, out: SchedulerOutput | None) -> None:
        """Fresh device blocks after req's hits receive host blocks: `back` are chain hashes
        of host-cached blocks (cached=True) or a swapped request's own slots."""
        out = out if out is not None else self._out
        assert out is not None, "a swap-in needs the SchedulerOutput to record the copy"
        slots = self.host.load(back) if cached else back   # load pins: no eviction reuses them now
        assert len(slots) == len(back), "the host tier changed between admission_hits and allocate_slots"
        first = len(req.block_ids)
        blocks = self.allocator.allocate(len(slots))       # may evict: those swap-outs run first
        out.blocks_to_swap_in.extend(zip(slots, blocks))
        req.block_ids.extend(blocks)
        self.num_swapped_in += len(blocks)
        if cached:                  # full blocks of known content: reusable on the device now
            self._publish_range(req, first, first + len(blocks))
            self._published[req.request_id] = first + len(blocks)
        else:
            self._published.setdefault(req.request_id, 0)

    def swap_out(self, req: Request, out: SchedulerOutput) -> bool:
        """Swap preemption: copy req's computed blocks to owned host slots, free its device
        blocks, remember its computed tokens for the next admission. False (nothing changed)
        without a host tier, with nothing computed, or when the host pool lacks room."""
        n = self.blocks_for(req.num_computed_tokens)
        if self.host is None or n == 0 or req.request_id in self._swapped:
            return False
        slots = self.host.allocate(n)
        if slots is None:
            return False
        out.blocks_to_swap_out.extend(zip(req.block_ids[:n], slots))
        self._swapped[req.request_id] = (slots, req.num_computed_tokens)
        self.num_swapped_out += n
        self.num_swap_preemptions += 1
        self.free(req)
        return True

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._swapped

    def num_host_slots_held(self) -> int:
        """Host slots owned by swapped-out requests (the host pool's owned count, if none leak)."""
        return sum(len(slots) for slots, _ in self._swapped.values())

    # -- the step bracket (host tier) --
    def begin_step(self, out: SchedulerOutput) -> None:
        """The scheduler starts a step: copies are recorded in `out` until end_step."""
        self._out = out
        if self.host is not None:
            self.host.begin_step()

    def end_step(self) -> None:
        self._out = None

    def _on_evict(self, block: int, block_hash: int) -> None:
        """The allocator is about to reuse a cached block: keep a host copy (if it has room)."""
        if self._out is None:
            return                    # outside schedule(): no step to carry the copy
        slot = self.host.store(block_hash)
        if slot is not None:
            self._out.blocks_to_swap_out.append((block, slot))
            self.num_swapped_out += 1

    def _shared_write_block(self, req: Request) -> int | None:
        """Index in req.block_ids of the block its next token is written to, if another
        request holds it too (a forked sibling's, or its parent's): it must be copied first."""
        i = req.num_computed_tokens // self.block_size
        if i >= len(req.block_ids) or self.allocator.ref_count(req.block_ids[i]) <= 1:
            return None
        return i

    def trim(self, req: Request, end: int, *, limit: int | None = None) -> None:
        """Free tail blocks beyond what positions [0, end) + lookahead need (rolled-back draft
        slots)."""
        keep_end = end + self.num_lookahead_tokens
        if limit is not None:
            keep_end = min(keep_end, max(end, limit))
        keep = self.blocks_for(keep_end)
        if len(req.block_ids) > keep:
            tail = req.block_ids[keep:]
            del req.block_ids[keep:]
            self.allocator.free(list(reversed(tail)))

    def fork(self, child: Request, parent: Request, num_tokens: int) -> None:
        """child starts on parent's blocks for its first num_tokens tokens (ref += 1 each)."""
        blocks = parent.block_ids[: self.blocks_for(num_tokens)]
        self.allocator.fork(blocks)
        child.block_ids = list(blocks)
        self._published[child.request_id] = min(self._published.get(parent.request_id, 0),
                                                 num_tokens // self.block_size)

    # -- after a step --
    def publish(self, req: Request) -> None:
        """Publish blocks that are now full of computed tokens (prompt and output alike)."""
        if not self.enable_prefix_caching:
            return
        full = min(req.num_computed_tokens // self.block_size, len(req.block_ids))
        done = self._published.get(req.request_id, 0)
        if full <= done:
            return
        self._publish_range(req, done, full)
        self._published[req.request_id] = full

    def _publish_range(self, req: Request, start: int, stop: int) -> None:
        hashes = self._block_hashes(req, stop)
        if self.keyed_by_tokens:                     # a token tree also needs the block's ids
            bs, toks, salt = self.block_size, req.all_token_ids, req.cache_salt
            for i in range(start, stop):
                self.allocator.publish(req.block_ids[i], hashes[i], tokens=toks[i * bs:(i + 1) * bs],
                                       parent=hashes[i - 1] if i else None, extra=salt)
        else:
            for i in range(start, stop):
                self.allocator.publish(req.block_ids[i], hashes[i])

    def free(self, req: Request) -> None:
        """Drop req's references (tail blocks first in the eviction order); its hash chain is
        kept (a preempted request looks its prefix up again)."""
        if req.block_ids:
            self.allocator.free(list(reversed(req.block_ids)))
        req.block_ids = []
        self._published[req.request_id] = 0

    def forget(self, request_id: str) -> None:
        """A finished request: drop its hash chain (and the host slots it was swapped to)."""
        self._hashes.pop(request_id, None)
        self._published.pop(request_id, None)
        swapped = self._swapped.pop(request_id, None)
        if swapped is not None:
            self.host.free(swapped[0])

    def _block_hashes(self, req: Request, num_blocks: int) -> list[int]:
        """The first num_blocks hashes of the request's token chain (computed incrementally)."""
        chain = self._hashes.setdefault(req.request_id, [])
        if len(chain) < num_blocks:
            bs = self.block_size
            tokens = req.all_token_ids[len(chain) * bs:num_blocks * bs]
            chain.extend(hash_blocks(tokens, bs, req.cache_salt, chain[-1] if chain else NONE_HASH))
        return chain[:num_blocks]

    def __repr__(self) -> str:
        a = self.allocator
        return (f"KVCacheManager(blocks={a.num_blocks}x{self.block_size}, free={a.num_free_blocks()}, "
                f"cached={a.num_cached_blocks()}, prefix_caching={self.enable_prefix_caching}"
                + (f", host={self.host!r}" if self.host is not None else "") + ")")
