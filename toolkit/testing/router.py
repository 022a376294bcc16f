"""Conformance check for routers (the contract in toolkit/routing/base.py).

    from toolkit.testing import check_router
    check_router(lambda: MyRouter(seed=0))

hypothesis generates fleets of 1-8 replica views (some dead, loads, KV usage, cached block
hashes) and streams of requests (prompts sharing a few system prompts, random tails, some
shorter than a block); after each choice the chosen replica's view gains a waiting request,
as a front door's would. Checked: the answer is an int index of a live replica; views and
requests are left as they were; two routers from the factory make the same choices on the
same stream (seeded randomness only); a fleet with one live replica gets that one; a fleet
with none raises NoReplicaAlive, an empty one ValueError.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

from hypothesis import given
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from toolkit.blocks.hashing import hash_blocks
from toolkit.routing.base import NoReplicaAlive, ReplicaView, RouteRequest

BLOCK = 4          # block size of the generated prompts' cached-block summaries


@st.composite
def fleets(draw, max_replicas: int = 8) -> list[ReplicaView]:
    n = draw(st.integers(1, max_replicas))
    views = []
    for i in range(n):
        views.append(ReplicaView(i, alive=draw(st.booleans()) or draw(st.booleans()),
                                 num_running=draw(st.integers(0, 20)), num_waiting=draw(st.integers(0, 20)),
                                 kv_usage=draw(st.floats(0.0, 1.0)),
                                 cached_blocks=frozenset(draw(st.lists(st.integers(0, 2 ** 64), max_size=4)))))
    return views


@st.composite
def requests(draw, n_systems: int = 3, vocab: int = 50) -> RouteRequest:
    systems = [[(s * 7 + k) % vocab for k in range(3 * BLOCK)] for s in range(n_systems)]
    head = systems[draw(st.integers(0, n_systems - 1))] if draw(st.booleans()) else []
    tail = draw(st.lists(st.integers(0, vocab - 1), max_size=3 * BLOCK))
    rid = f"r{draw(st.integers(0, 10 ** 6))}"
    return RouteRequest(rid, tuple(head + tail), client_id=draw(st.sampled_from([None, "a", "b"])))


def _cache_of(views: list[ReplicaView], req: RouteRequest, block_size: int) -> list[ReplicaView]:
    """Some views hold the request's prompt blocks (so cache-aware routers see hits)."""
    hashes = frozenset(hash_blocks(list(req.prompt_token_ids), block_size))
    return [dataclasses.replace(v, cached_blocks=v.cached_blocks | hashes) if v.index % 2 == 0 else v
            for v in views]


def _choose_checked(router: Any, req: RouteRequest, views: list[ReplicaView]) -> int:
    before, req_before = copy.deepcopy(views), copy.deepcopy(req)
    got = router.choose(req, views)
    assert isinstance(got, int) and not isinstance(got, bool), f"choose returned {got!r}, not an int"
    assert 0 <= got < len(views), f"choose returned {got} for {len(views)} replicas"
    assert views[got].alive, f"choose returned dead replica {got}: {views[got]}"
    for a, b in zip(views, before):
        assert a == b and a.cached_blocks == b.cached_blocks, f"choose changed a view: {b} -> {a}"
    assert req == req_before, "choose changed the request"
    return got


def _stream(router: Any, fleet: list[ReplicaView], reqs: list[RouteRequest], block_size: int) -> list[int]:
    views, picks = list(fleet), []
    for k, req in enumerate(reqs):
        shown = _cache_of(views, req, block_size) if k % 3 == 0 else views
        i = _choose_checked(router, req, shown)
        picks.append(i)
        views[i] = dataclasses.replace(views[i], num_waiting=views[i].num_waiting + 1)
    return picks


def check_router(factory: Callable[[], Any], *, block_size: int = BLOCK, max_examples: int | None = None) -> None:
    """Run the conformance properties on routers made by `factory()` (a fresh one per case).
    `block_size`: the block size the router hashes prompts with (cached-block summaries are
    made with it)."""

    def fleet_case(fleet: list[ReplicaView], reqs: list[RouteRequest]) -> None:
        if not any(v.alive for v in fleet):
            fleet = [dataclasses.replace(fleet[0], alive=True)] + fleet[1:]
        a = _stream(factory(), fleet, reqs, block_size)
        b = _stream(factory(), fleet, reqs, block_size)
        assert a == b, f"two routers from the factory chose differently on the same stream: {a} != {b}"
        only = [dataclasses.replace(v, alive=(v.index == len(fleet) - 1)) for v in fleet]
        router = factory()
        for req in reqs:
            assert _choose_checked(router, req, only) == len(fleet) - 1, "one live replica, not chosen"
        dead = [dataclasses.replace(v, alive=False) for v in fleet]
        try:
            factory().choose(reqs[0], dead)
        except NoReplicaAlive:
            pass
        else:
            raise AssertionError("choose() over dead replicas only must raise NoReplicaAlive")
        try:
            factory().choose(reqs[0], [])
        except ValueError:
            pass
        else:
            raise AssertionError("choose() over no replicas must raise ValueError")

    run = given(fleets(), st.lists(requests(), min_size=1, max_size=12))(fleet_case)
    if max_examples is not None:
        run = Settings(max_examples=max_examples)(run)
    try:
        run()
    except Flaky as e:          # a failure that did not repeat: randomness the seed does not fix
        raise AssertionError(f"the router's choices are not reproducible (unseeded randomness or "
                             f"hidden state shared between instances): {e}") from e
