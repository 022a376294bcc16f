"""StaticBatchingScheduler and ReferenceScheduler cases, the simulated clock, and the registry names."""

from __future__ import annotations

import random

import pytest

from toolkit import registry
from toolkit.blocks.reference import ReferenceAllocator
from toolkit.schedulers import ContinuousBatchingScheduler, ReferenceScheduler, StaticBatchingScheduler
from toolkit.schedulers.simulate import fake_token, simulate
from toolkit.types import Request, SamplingParams


def req(rid: str, n: int, max_tokens: int, t: float = 0.0) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_time=t)


def drive(s, limit: int = 500) -> list[dict[str, tuple[int, int]]]:
    steps = []
    for _ in range(limit):
        if not s.has_unfinished():
            return steps
        out = s.schedule()
        steps.append({x.request_id: (x.start, x.num_new_tokens) for x in out.scheduled})
        s.update(out, {x.request_id: [5] for x in out.scheduled if x.samples})
    raise AssertionError("did not finish")


def test_static_runs_a_fixed_batch_to_completion() -> None:
    s = StaticBatchingScheduler(ReferenceAllocator(64, 4), block_size=4, max_num_seqs=2, max_num_batched_tokens=6)
    s.add_request(req("a", 4, 1, 0))
    s.add_request(req("b", 4, 3, 1))
    s.add_request(req("c", 2, 1, 2))
    steps = drive(s)
    assert steps[0] == {"a": (0, 4), "b": (0, 2)}            # the prompts in chunks of the budget
    assert steps[1] == {"b": (2, 2)}                          # a done after its 1 token, c must wait
    assert steps[2] == {"b": (4, 1)} and steps[3] == {"b": (5, 1)}
    assert steps[4] == {"c": (0, 2)}                          # next batch only now
    assert s.allocator.num_free_blocks() == 64


def test_static_reserves_whole_lives_so_it_never_preempts() -> None:
    # each request needs blocks for 6 + 6 - 1 = 11 tokens = 3 blocks; 5 blocks hold one batch member
    s = StaticBatchingScheduler(ReferenceAllocator(5, 4), block_size=4, max_num_seqs=4)
    for i in range(3):
        s.add_request(req(f"r{i}", 6, 6, i))
    steps = drive(s)
    assert all(len(st) <= 1 for st in steps) and len(steps) == 3 * 6


def test_reference_admits_only_what_fits_for_prompt_plus_max_tokens() -> None:
    s = ReferenceScheduler(ReferenceAllocator(6, 4), block_size=4, max_num_seqs=4)
    s.add_request(req("a", 6, 6, 0))     # 3 blocks
    s.add_request(req("b", 6, 6, 1))     # 3 blocks
    s.add_request(req("c", 2, 2, 2))     # 1 block, but waits behind b (no overtaking)
    steps = drive(s)
    assert steps[0] == {"a": (0, 6), "b": (0, 6)}
    assert "c" not in set().union(*steps[:6]) and "c" in steps[6]


def test_simulated_clock_continuous_beats_static() -> None:
    rng = random.Random(0)
    spec = [(i * 0.002, rng.randint(8, 64), rng.randint(2, 48)) for i in range(40)]

    def lat(cls) -> float:
        arrivals = [(t, req(f"r{i}", n, m)) for i, (t, n, m) in enumerate(spec)]
        res = simulate(cls(ReferenceAllocator(64, 16), block_size=16, max_num_seqs=8,
                           max_num_batched_tokens=256), arrivals)
        assert all(r.finish_reason == "length" and r.num_output_tokens == m
                   for r, (_, _, m) in zip(res.values(), spec))
        return sum(r.latency for r in res.values()) / len(res)

    assert lat(ContinuousBatchingScheduler) < 0.8 * lat(StaticBatchingScheduler)


def test_fake_token_is_a_function_of_request_and_position() -> None:
    assert fake_token("a", 3, 100) == fake_token("a", 3, 100)
    assert len({fake_token("a", p, 1000) for p in range(50)}) > 30


@pytest.mark.parametrize("name", ["continuous", "static", "reference"])
def test_registry_names(name: str) -> None:
    cls = registry.lookup("scheduler", name)
    s = cls(ReferenceAllocator(8, 4), block_size=4, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64)
    s.add_request(req("x", 3, 2))
    assert drive(s) and repr(s).startswith(cls.__name__)
