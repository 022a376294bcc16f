"""What a scheduling policy may look at: a read-only view of its scheduler and KV cache.

A policy gets a `SchedulerView` once, in `Policy.bind(view)`, from the scheduler that runs
it. It reads; it never allocates, frees or reorders anything itself (the scheduler acts on
the policy's answers), so a policy cannot break the block accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.types import Request

if TYPE_CHECKING:
    from toolkit.schedulers.kv_cache_manager import KVCacheManager


class KVView:
    """The KV-cache manager's read-only queries (no references taken, nothing changed)."""

    def __init__(self, kv: "KVCacheManager") -> None:
        self._kv = kv

    @property
    def block_size(self) -> int:
        return self._kv.block_size

    @property
    def capacity_blocks(self) -> int:
        """Blocks one request may hold when it runs alone."""
        return self._kv.capacity_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return self._kv.blocks_for(num_tokens)

    def num_free_blocks(self) -> int:
        return self._kv.num_free_blocks()

    def num_used_blocks(self) -> int:
        return self._kv.num_used_blocks()

    def num_cached_blocks(self) -> int:
        return self._kv.num_cached_blocks()

    def num_cached_tokens(self, request: Request) -> int:
        """Leading tokens of `request` a prefix-cache lookup would hit now (0 without prefix
        caching); a multiple of the block size, never the last token's block."""
        return self._kv.num_cached_tokens(request)

    def __repr__(self) -> str:
        return f"KVView(free={self.num_free_blocks()}, cached={self.num_cached_blocks()})"


class SchedulerView:
    """Read-only: the scheduler's clock, queues, limits and KV cache, as a policy sees them."""

    def __init__(self, scheduler) -> None:
        self._s = scheduler
        self.kv = KVView(scheduler.kv)

    def now(self) -> float:
        """The scheduler's time at the start of the current step (seconds; the engine's
        clock is time.monotonic, the simulator's is virtual; Request.arrival_time is on it)."""
        return self._s.now

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._s.running)

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(self._s.waiting)

    @property
    def num_running(self) -> int:
        return len(self._s.running)

    @property
    def num_waiting(self) -> int:
        return len(self._s.waiting)

    @property
    def max_num_seqs(self) -> int:
        return self._s.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self._s.max_num_batched_tokens

    def __repr__(self) -> str:
        return (f"SchedulerView(now={self.now():.3f}, running={len(self._s.running)}, "
                f"waiting={len(self._s.waiting)}, {self.kv!r})")
