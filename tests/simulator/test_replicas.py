"""ReplicaSimulator: routers over N simulated replicas of the real scheduler."""

from __future__ import annotations

import pytest

from toolkit.simulator import Simulator, make_trace, multi_client_trace, synthetic_lengths
from toolkit.simulator.replicas import ReplicaSimulator, compare_routers


def _cost(out) -> float:          # 5 ms a step plus 20 us a token (no admission terms)
    return 0.005 + 2e-5 * sum(s.num_new_tokens for s in out.scheduled)


SMALL = dict(num_blocks=160, block_size=16, max_num_seqs=16, max_num_batched_tokens=512)


def test_one_replica_is_the_simulator():
    trace = make_trace(synthetic_lengths(40, seed=1, prompt_median=60, output_median=20), rate=50.0)
    one = ReplicaSimulator("round_robin", 1, cost=_cost, **SMALL).run(trace)
    ref = Simulator(cost=_cost, **SMALL).run(trace)
    for rid, t in ref.requests.items():
        assert one.requests[rid].token_times == pytest.approx(t.token_times)
        assert one.requests[rid].finish_reason == t.finish_reason
    assert len(one.steps) == len(ref.steps)


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "power_of_two", "prefix_affinity",
                                    "cache_aware"])
def test_every_request_finishes_on_its_replica(router):
    trace = multi_client_trace(synthetic_lengths(60, seed=2, prompt_median=50, output_median=16),
                               {"a": 30.0, "b": 10.0}, system_prompt_len=48)
    run = ReplicaSimulator(router, 3, cost=_cost, **SMALL).run(trace)
    assert all(t.finish_reason == "length" and len(t.token_times) == t.output_len
               for t in run.requests.values())
    assert sum(run.requests_per_replica) == 60 and set(run.replica_of) == set(run.requests)
    assert [s.time for s in run.steps] == sorted(s.time for s in run.steps)
    if router == "round_robin":
        assert run.requests_per_replica == [20, 20, 20]


def test_prefix_affinity_raises_the_hit_rate_on_a_shared_prefix_trace():
    # 12 system prompts of 8 blocks each; a replica's cache holds about 8 of them besides the
    # running requests, so spreading every prompt everywhere thrashes the caches
    trace = make_trace(synthetic_lengths(240, seed=0, prompt_median=24, output_median=8, max_prompt=64),
                       rate=200.0, system_prompts=12, system_prompt_len=128)
    rr, pa, ca = compare_routers(["round_robin", "prefix_affinity", "cache_aware"], 4, trace,
                                 cost=_cost, **{**SMALL, "num_blocks": 96})
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.15, (rr["prefix_hit_rate"], pa["prefix_hit_rate"])
    assert ca["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.15
    assert pa["finished"] == rr["finished"] == 240


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="num_replicas"):
        ReplicaSimulator("round_robin", 0, cost=_cost)
    with pytest.raises(ValueError, match="unknown router"):
        ReplicaSimulator("nope", 2, cost=_cost)
    with pytest.raises(ValueError, match="cost"):
        ReplicaSimulator("round_robin", 2)
