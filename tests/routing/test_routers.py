"""Routers: the public conformance check on each, and each policy's own property."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.registry import REGISTRY, create_part
from toolkit.routing import (
    CacheAwareRouter,
    LeastLoadedRouter,
    NoReplicaAlive,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    ReplicaView,
    RoundRobinRouter,
    RouteRequest,
    alive_indices,
    prompt_hashes,
)
from toolkit.testing import check_router
from toolkit.testing.router import fleets

FACTORIES = {
    "round_robin": RoundRobinRouter,
    "least_loaded": LeastLoadedRouter,
    "power_of_two": lambda: PowerOfTwoRouter(seed=3),
    "prefix_affinity": lambda: PrefixAffinityRouter(block_size=4, prefix_blocks=2),
    "cache_aware": lambda: CacheAwareRouter(block_size=4),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_conformance(name):
    check_router(FACTORIES[name], max_examples=30)


def test_every_registered_router_is_checked():
    assert set(REGISTRY["router"]) == set(FACTORIES)
    for name in REGISTRY["router"]:
        assert callable(create_part("router", name).choose)


class _PicksDead:
    def choose(self, request, replicas):
        return 0


class _Unseeded:
    def __init__(self):
        import random
        self.rng = random.Random()

    def choose(self, request, replicas):
        return self.rng.choice(alive_indices(replicas))


@pytest.mark.parametrize("broken", [_PicksDead, _Unseeded])
def test_conformance_catches_a_broken_router(broken):
    with pytest.raises(AssertionError):
        check_router(broken, max_examples=50)


def _views(loads):
    return [ReplicaView(i, num_running=r, num_waiting=w) for i, (r, w) in enumerate(loads)]


@given(fleets())
def test_least_loaded_takes_the_lowest_vllm_score(fleet):
    if not any(v.alive for v in fleet):
        with pytest.raises(NoReplicaAlive):
            LeastLoadedRouter().choose(RouteRequest("r"), fleet)
        return
    i = LeastLoadedRouter().choose(RouteRequest("r"), fleet)
    assert fleet[i].score == min(v.num_waiting * 4 + v.num_running for v in fleet if v.alive)


def test_round_robin_cycles_and_skips_the_dead():
    views = _views([(0, 0)] * 3)
    rr = RoundRobinRouter()
    assert [rr.choose(RouteRequest("r"), views) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    views[1] = dataclasses.replace(views[1], alive=False)
    assert [rr.choose(RouteRequest("r"), views) for _ in range(4)] == [0, 2, 0, 2]


def test_power_of_two_never_takes_the_more_loaded_of_its_pair():
    views = _views([(0, 0), (50, 50)])          # with two replicas the pair is always both
    p2 = PowerOfTwoRouter(seed=1)
    assert {p2.choose(RouteRequest("r"), views) for _ in range(20)} == {0}


def _prompt(system: int, tail: list[int], length: int = 16) -> RouteRequest:
    head = [(system * 31 + k) % 97 for k in range(length)]
    return RouteRequest(f"s{system}", tuple(head + tail))


@given(st.lists(st.lists(st.integers(0, 96), max_size=20), min_size=2, max_size=10))
def test_prefix_affinity_sends_a_shared_system_prompt_to_one_replica(tails):
    router = PrefixAffinityRouter(block_size=4, prefix_blocks=4)
    views = _views([(2, 0)] * 4)              # even loads: the bound never bites
    picks = {router.choose(_prompt(7, t), views) for t in tails}
    assert len(picks) == 1


def test_prefix_affinity_spreads_distinct_prefixes_and_respects_the_load_bound():
    router = PrefixAffinityRouter(block_size=4, prefix_blocks=2, load_factor=1.25)
    views = _views([(0, 0)] * 4)
    picks = [router.choose(_prompt(s, []), views) for s in range(200)]
    assert len(set(picks)) == 4                 # the ring covers every replica
    views = _views([(0, 0)] * 4)
    for _ in range(40):                         # one hot prefix: overflow walks the ring
        i = router.choose(_prompt(5, []), views)
        live_total = sum(v.load for v in views)
        assert views[i].load + 1 <= -(-1.25 * (live_total + 1) // 4)
        views[i] = dataclasses.replace(views[i], num_running=views[i].num_running + 1)
    assert max(v.load for v in views) <= 13     # ceil(1.25 * 40 / 4)
    assert sum(v.load > 0 for v in views) >= 3


def test_prefix_affinity_a_dead_replica_moves_only_its_keys():
    router = PrefixAffinityRouter(block_size=4, prefix_blocks=2)
    views = _views([(0, 0)] * 4)
    before = [router.choose(_prompt(s, []), views) for s in range(100)]
    views[2] = dataclasses.replace(views[2], alive=False)
    after = [router.choose(_prompt(s, []), views) for s in range(100)]
    for b, a in zip(before, after):
        assert a == b or b == 2
        assert a != 2


def test_prefix_affinity_short_prompt_goes_to_the_least_loaded():
    router = PrefixAffinityRouter(block_size=16)
    assert router.choose(RouteRequest("r", (1, 2, 3)), _views([(3, 1), (1, 0), (0, 2)])) == 1


def test_cache_aware_takes_the_longest_cached_prefix():
    req = _prompt(3, [1, 2, 3, 4, 5, 6, 7, 8])
    hashes = prompt_hashes(req, 4)
    views = [ReplicaView(0, cached_blocks=frozenset(hashes[:1])),
             ReplicaView(1, cached_blocks=frozenset(hashes[:5])),
             ReplicaView(2, cached_blocks=frozenset(hashes[1:]))]   # no first block: no match
    assert CacheAwareRouter(block_size=4).choose(req, views) == 1
    views[1] = dataclasses.replace(views[1], num_running=30)        # over the load bound
    assert CacheAwareRouter(block_size=4).choose(req, views) == 0


@pytest.mark.parametrize("bad", [dict(block_size=0), dict(load_factor=0.5), dict(prefix_blocks=0),
                                 dict(virtual_nodes=0)])
def test_prefix_affinity_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        PrefixAffinityRouter(**bad)
