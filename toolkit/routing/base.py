"""The Router contract: which of N data-parallel replicas serves a request.

    router.choose(request, replicas) -> index into replicas

`request` is anything with `request_id` and `prompt_token_ids` (a scheduler `Request`, a
`RouteRequest`); `replicas` are read-only `ReplicaView`s, one per replica, in replica order.
A router never picks a replica whose view says `alive=False`, never mutates a view, and is
deterministic for a given construction (seeded randomness only). With no live replica it
raises `NoReplicaAlive` (a `RuntimeError`: a state of the fleet, not bad input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class ReplicaView:
    """What a router may know of one replica (a snapshot; routers only read it).

    num_running / num_waiting: requests the replica is decoding / has not started streaming
    (the front counts them as it routes, so they are never stale); kv_usage: fraction of KV
    blocks in use, 0-1, from the replica's last step; cached_blocks: block hashes (the
    chain of `toolkit.blocks.hashing.hash_blocks`) the replica holds or is believed to hold
    in its prefix cache (exact in the simulator; in a server, the prefixes recently routed
    there)."""

    index: int
    alive: bool = True
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    cached_blocks: Container[int] = field(default_factory=frozenset, compare=False)

    @property
    def load(self) -> int:
        """Unfinished requests on the replica."""
        return self.num_running + self.num_waiting

    @property
    def score(self) -> int:
        """vLLM's data-parallel load-balancer score: a waiting request weighs four running."""
        return self.num_waiting * 4 + self.num_running


@dataclass(frozen=True)
class RouteRequest:
    """The part of a request a router reads (a scheduler `Request` serves as well)."""

    request_id: str
    prompt_token_ids: Sequence[int] = ()
    client_id: str | None = None
    cache_salt: int = 0


class NoReplicaAlive(RuntimeError):
    """Every replica is dead: nothing can serve the request."""


@runtime_checkable
class Router(Protocol):
    def choose(self, request: Any, replicas: Sequence[ReplicaView]) -> int: ...


def alive_indices(replicas: Sequence[ReplicaView]) -> list[int]:
    """Positions of the live replicas; NoReplicaAlive (or ValueError for none given) if empty."""
    if len(replicas) == 0:
        raise ValueError("choose() needs at least one replica view")
    live = [i for i, r in enumerate(replicas) if r.alive]
    if not live:
        raise NoReplicaAlive(f"all {len(replicas)} replicas are dead")
    return live
