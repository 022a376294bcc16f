"""The BlockAllocator contract: integers in, integers out; it never sees a request."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


class OutOfBlocks(RuntimeError):
    """Raised by `allocate` when fewer blocks are free than asked; nothing was allocated."""


@runtime_checkable
class BlockAllocator(Protocol):
    """Optional capability `keyed_by_tokens` (class attribute, default False when absent): a
    prefix cache keyed by token ids (blocks/radix.py) sets it True, and callers then pass,
    besides the hashes, `lookup(hashes, tokens=ids, extra=salt)` / `peek(...)` (ids: the
    request's tokens, at least len(hashes) full blocks) and `publish(id, hash, tokens=the
    block's block_size ids, parent=the previous block's hash or None for the first, extra=salt)`.
    Hash-keyed allocators are called exactly as before.

    Optional capability `reports_evictions` (default False when absent): the allocator calls
    its attribute `on_evict(block_id, block_hash)` (when set, by the KV-cache manager) for
    each cached block it evicts, before `allocate` returns that block. The manager's host
    tier needs it (blocks/host_tier.py)."""

    block_size: int
    num_blocks: int
    num_reserved: int        # blocks never handed out (0 for the toolkit's allocators)

    def num_free_blocks(self) -> int:
        """Blocks that `allocate` can hand out now (free + evictable cached blocks)."""

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with ref count 1; raises OutOfBlocks (changing nothing) if short."""

    def free(self, block_ids: Sequence[int]) -> None:
        """ref -= 1 for each; the order given is the eviction order of cached blocks."""

    def fork(self, block_ids: Sequence[int]) -> None:
        """ref += 1 for each (sharing between samples / sequences)."""

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest cached prefix of `block_hashes`, ref += 1 each."""

    def peek(self, block_hashes: Sequence[int]) -> int:
        """How many leading hashes `lookup` would hit now; no reference is taken, nothing
        changes (a plain allocator answers 0). Policies look at the cache through this."""

    def publish(self, block_id: int, block_hash: int) -> None:
        """A full block's content is final: make it reusable under `block_hash`."""

    def ref_count(self, block_id: int) -> int:
        """References held on a block (0 when free); sharing (n > 1) copies a block before a
        request writes into it when this is above 1."""

    def num_cached_blocks(self) -> int:
        """Blocks that hold a published hash (held or evictable)."""
