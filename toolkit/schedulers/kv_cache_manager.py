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
"""

from __future__ import annotations

from typing import Sequence

from toolkit.blocks.hashing import NONE_HASH, hash_blocks
from toolkit.types import Request, SchedulerOutput


class KVCacheManager:
    def __init__(self, allocator, *, block_size: int, enable_prefix_caching: bool = False,
                 num_lookahead_tokens: int = 0) -> None:
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

    def release(self, hits: Sequence[int]) -> None:
        """Give back hits that allocate_slots did not take."""
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
                       hits: Sequence[int] | None = None, out: SchedulerOutput | None = None) -> bool:
        """Make req's block table cover positions [0, end) plus the lookahead (never past
        `limit`, the last position it may ever compute). `hits` (from computed_blocks) become
        its first blocks when it holds none. A block req will write next that another
        request also holds is replaced by a private copy (recorded in out.blocks_to_copy).
        False when too few blocks are free; then nothing changed (hits are still the
        caller's)."""
        if hits:
            assert not req.block_ids, "hits are for a request that holds no blocks"
        alloc_end = end + self.num_lookahead_tokens
        if limit is not None:
            alloc_end = min(alloc_end, max(end, limit))
        held = len(hits) if hits else len(req.block_ids)
        shared = None if hits else self._shared_write_block(req)
        grow = -(-alloc_end // self.block_size) - held        # blocks_for(alloc_end) - held
        if grow <= 0:
            if shared is None and not hits:
                return True            # the common decode step: its block is there already
            grow = 0
        if grow + (shared is not None) > self.allocator.num_free_blocks():
            return False
        if hits:
            req.block_ids = list(hits)
            self._published[req.request_id] = len(hits)
        if shared is not None:
            (new,) = self.allocator.allocate(1)
            assert out is not None, "a copy-on-write needs the SchedulerOutput to record the copy"
            out.blocks_to_copy.append((req.block_ids[shared], new))
            self.allocator.free([req.block_ids[shared]])
            req.block_ids[shared] = new
        if grow:
            req.block_ids.extend(self.allocator.allocate(grow))
        return True

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
        hashes = self._block_hashes(req, full)
        if self.keyed_by_tokens:                     # a token tree also needs the block's ids
            bs, toks, salt = self.block_size, req.all_token_ids, req.cache_salt
            for i in range(done, full):
                self.allocator.publish(req.block_ids[i], hashes[i], tokens=toks[i * bs:(i + 1) * bs],
                                       parent=hashes[i - 1] if i else None, extra=salt)
        else:
            for i in range(done, full):
                self.allocator.publish(req.block_ids[i], hashes[i])
        self._published[req.request_id] = full

    def free(self, req: Request) -> None:
        """Drop req's references (tail blocks first in the eviction order); its hash chain is
        kept (a preempted request looks its prefix up again)."""
        if req.block_ids:
            self.allocator.free(list(reversed(req.block_ids)))
        req.block_ids = []
        self._published[req.request_id] = 0

    def forget(self, request_id: str) -> None:
        """A finished request: drop its hash chain."""
        self._hashes.pop(request_id, None)
        self._published.pop(request_id, None)

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
                f"cached={a.num_cached_blocks()}, prefix_caching={self.enable_prefix_caching})")
