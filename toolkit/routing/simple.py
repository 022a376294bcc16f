"""Load-only routers: round-robin, least-loaded (vLLM's DP score), power of two choices."""

from __future__ import annotations

import random
from typing import Any, Sequence

from toolkit.routing.base import ReplicaView, alive_indices


class RoundRobinRouter:
    """Each request to the next live replica in turn (a dead one is skipped)."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int:
        live = alive_indices(replicas)
        n = len(replicas)
        for k in range(n):
            i = (self._next + k) % n
            if replicas[i].alive:
                self._next = i + 1
                return i
        return live[0]                     # unreachable: live is not empty

    def __repr__(self) -> str:
        return "RoundRobinRouter()"


class LeastLoadedRouter:
    """The live replica of lowest score (waiting * 4 + running, vLLM's DP load balancer);
    ties go to the lowest kv_usage, then the lowest index."""

    def __init__(self) -> None:
        pass

    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int:
        return min(alive_indices(replicas), key=lambda i: (replicas[i].score, replicas[i].kv_usage, i))

    def __repr__(self) -> str:
        return "LeastLoadedRouter()"


class PowerOfTwoRouter:
    """Two live replicas drawn at random (seeded), the one of lower score kept (Mitzenmacher's
    power of two choices: near least-loaded balance from two looks, and no herd on one
    replica when views lag)."""

    def __init__(self, seed: int = 0) -> None:
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
        self.seed = seed
        self._rng = random.Random(seed)

    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int:
        live = alive_indices(replicas)
        if len(live) == 1:
            return live[0]
        a, b = self._rng.sample(live, 2)
        return min((a, b), key=lambda i: (replicas[i].score, i))

    def __repr__(self) -> str:
        return f"PowerOfTwoRouter(seed={self.seed})"
