"""Prefix-aware routers: a shared system prompt's KV is built on one replica and reused there.

PrefixAffinityRouter: consistent hashing of the prompt's leading blocks (the block-hash
chain of `toolkit.blocks.hashing`, so the key is exactly what the prefix cache keys on),
with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018): a replica takes the request
only while its load stays within `load_factor` times the mean; otherwise the walk goes on
clockwise round the ring. Every prompt with the same leading blocks goes to the same replica
until that replica is overloaded, and a dead replica moves only its own keys.

CacheAwareRouter: the live replica whose `cached_blocks` hold the longest prefix of the
prompt's blocks (SGLang's router idea), within the same load bound; else the least loaded.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from typing import Any, Sequence

import numpy as np

from toolkit.blocks.hashing import hash_blocks
from toolkit.routing.base import ReplicaView, alive_indices


def _check(block_size: int, load_factor: float) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not (isinstance(load_factor, (int, float)) and load_factor >= 1.0):
        raise ValueError(f"load_factor must be a number >= 1 (1 = perfect balance), got {load_factor!r}")


def prompt_hashes(request: Any, block_size: int, max_blocks: int | None = None) -> list[int]:
    """Block hashes of the request's prompt (its full blocks, at most max_blocks), salted like
    the engine's prefix cache (cache_salt)."""
    ids = getattr(request, "prompt_token_ids", ()) or ()
    if max_blocks is not None:
        ids = ids[: max_blocks * block_size]
    # one conversion up front: hash_blocks then slices an int64 array per block
    return hash_blocks(np.asarray(ids, dtype=np.int64), block_size,
                       extra=int(getattr(request, "cache_salt", 0) or 0))


def load_bound(replicas: Sequence[ReplicaView], live: Sequence[int], load_factor: float) -> int:
    """The most requests a replica may hold after taking this one: ceil(c * (total + 1) / n).
    Some live replica is always under it (the loads sum to less than n times the bound)."""
    total = sum(replicas[i].load for i in live)
    return math.ceil(load_factor * (total + 1) / len(live))


class PrefixAffinityRouter:
    """Consistent hashing of the leading `prefix_blocks` blocks with bounded loads; a prompt
    shorter than one block (nothing to share) goes to the least-loaded replica."""

    def __init__(self, block_size: int = 16, prefix_blocks: int = 4, load_factor: float = 1.25,
                 virtual_nodes: int = 64, seed: int = 0) -> None:
        _check(block_size, load_factor)
        if not isinstance(prefix_blocks, int) or prefix_blocks < 1:
            raise ValueError(f"prefix_blocks must be a positive integer, got {prefix_blocks!r}")
        if not isinstance(virtual_nodes, int) or virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be a positive integer, got {virtual_nodes!r}")
        self.block_size, self.prefix_blocks, self.load_factor = block_size, prefix_blocks, float(load_factor)
        self.virtual_nodes, self.seed = virtual_nodes, seed
        self._rings: dict[int, tuple[list[int], list[int]]] = {}   # num replicas -> (points, owners)

    def ring(self, n: int) -> tuple[list[int], list[int]]:
        """Sorted ring points and the replica owning each, for n replicas (built once per n)."""
        if n not in self._rings:
            pts = sorted((_point(f"{self.seed}:{i}:{v}"), i) for i in range(n) for v in range(self.virtual_nodes))
            self._rings[n] = ([p for p, _ in pts], [i for _, i in pts])
        return self._rings[n]

    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int:
        live = alive_indices(replicas)
        hashes = prompt_hashes(request, self.block_size, self.prefix_blocks)
        if not hashes:
            return min(live, key=lambda i: (replicas[i].score, i))
        bound = load_bound(replicas, live, self.load_factor)
        points, owners = self.ring(len(replicas))
        start = bisect.bisect_left(points, hashes[-1] & ((1 << 64) - 1))
        for k in range(len(points)):
            i = owners[(start + k) % len(points)]
            if replicas[i].alive and replicas[i].load + 1 <= bound:
                return i
        return min(live, key=lambda i: (replicas[i].score, i))      # unreachable (see load_bound)

    def __repr__(self) -> str:
        return (f"PrefixAffinityRouter(block_size={self.block_size}, prefix_blocks={self.prefix_blocks}, "
                f"load_factor={self.load_factor}, virtual_nodes={self.virtual_nodes}, seed={self.seed})")


class CacheAwareRouter:
    """The live replica holding the longest cached prefix of the prompt (by its views'
    `cached_blocks`) if its load is within the bound and the match is at least
    `min_match_blocks`; else the least-loaded (vLLM's score)."""

    uses_cached_blocks = True          # a front door fills ReplicaView.cached_blocks for it

    def __init__(self, block_size: int = 16, load_factor: float = 1.25, min_match_blocks: int = 1) -> None:
        _check(block_size, load_factor)
        if not isinstance(min_match_blocks, int) or min_match_blocks < 1:
            raise ValueError(f"min_match_blocks must be a positive integer, got {min_match_blocks!r}")
        self.block_size, self.load_factor, self.min_match_blocks = block_size, float(load_factor), min_match_blocks

    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int:
        live = alive_indices(replicas)
        hashes = prompt_hashes(request, self.block_size)
        bound = load_bound(replicas, live, self.load_factor)
        best, best_len = None, self.min_match_blocks - 1
        for i in live:
            if replicas[i].load + 1 > bound:
                continue
            m = _matched(hashes, replicas[i].cached_blocks)
            if m > best_len or (m == best_len and best is not None and replicas[i].score < replicas[best].score):
                best, best_len = i, m
        if best is not None and best_len >= self.min_match_blocks:
            return best
        return min(live, key=lambda i: (replicas[i].score, i))

    def __repr__(self) -> str:
        return (f"CacheAwareRouter(block_size={self.block_size}, load_factor={self.load_factor}, "
                f"min_match_blocks={self.min_match_blocks})")


def _matched(hashes: Sequence[int], cached: Any) -> int:
    """Leading blocks of `hashes` found in `cached` (a chain: the first miss ends the prefix)."""
    n = 0
    for h in hashes:
        if h not in cached:
            break
        n += 1
    return n


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
