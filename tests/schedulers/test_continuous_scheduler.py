"""Focused cases of ContinuousBatchingScheduler: prefix hits, chunk sizes, preemption order,
ignored requests, stops, speculative rollback, aborts and argument errors."""

from __future__ import annotations

import pytest

from toolkit.blocks.reference import ReferenceAllocator
from toolkit.schedulers import ContinuousBatchingScheduler, Policy
from toolkit.types import Request, RequestStatus, SamplingParams, SchedulerOutput


def make(num_blocks: int = 16, block_size: int = 4, **kw) -> ContinuousBatchingScheduler:
    return ContinuousBatchingScheduler(ReferenceAllocator(num_blocks, block_size), block_size=block_size, **kw)


def req(rid: str, prompt: list[int], max_tokens: int = 4, t: float = 0.0, **kw) -> Request:
    params = {k: kw.pop(k) for k in list(kw) if k in SamplingParams.__dataclass_fields__}
    params.setdefault("ignore_eos", True)
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **params), arrival_time=t, **kw)


def step(s: ContinuousBatchingScheduler, token: int = 7, tokens: dict[str, list[int]] | None = None):
    out = s.schedule()
    sampled = {x.request_id: (tokens or {}).get(x.request_id, [token]) for x in out.scheduled if x.samples}
    return out, s.update(out, sampled)


def run(s: ContinuousBatchingScheduler, limit: int = 200) -> None:
    for _ in range(limit):
        if not s.has_unfinished():
            return
        step(s)
    raise AssertionError("did not finish")


def sched(out: SchedulerOutput) -> dict[str, tuple[int, int]]:
    return {x.request_id: (x.start, x.num_new_tokens) for x in out.scheduled}


# -- prefix caching --
def test_prefix_hit_counts_and_never_the_last_token() -> None:
    s = make()
    s.add_request(req("a", list(range(10)), max_tokens=1))
    run(s)
    rs = [req("b", list(range(10)), max_tokens=1),                # 2 full blocks of 10 tokens hit
          req("c", list(range(8)), max_tokens=1),                 # 8 tokens: the 2nd block holds the last one
          req("d", list(range(10)), max_tokens=1, cache_salt=5)]  # other salt: no hit
    for r in rs:
        s.add_request(r)
    out, _ = step(s)
    assert sched(out) == {"b": (8, 2), "c": (4, 4), "d": (0, 10)}
    assert [r.num_cached_tokens for r in rs] == [8, 4, 0]
    run(s)
    assert s.allocator.num_free_blocks() == 16


def test_output_blocks_are_published_too() -> None:
    s = make()
    s.add_request(req("a", [1, 2, 3, 4, 5, 6], max_tokens=3))
    for tok in (10, 11, 12):
        step(s, tok)
    # computed: 6 prompt + 10, 11 = 8 tokens = 2 full blocks
    assert s.allocator.num_cached_blocks() == 2
    s.add_request(req("b", [1, 2, 3, 4, 5, 6, 10, 11, 99], max_tokens=1))
    out, _ = step(s)
    assert sched(out) == {"b": (8, 1)}


def test_prefix_caching_off_never_looks_up() -> None:
    s = make(enable_prefix_caching=False)
    s.add_request(req("a", list(range(10)), max_tokens=1))
    run(s)
    assert s.allocator.num_cached_blocks() == 0
    s.add_request(req("b", list(range(10)), max_tokens=1))
    out, _ = step(s)
    assert sched(out) == {"b": (0, 10)}


# -- chunked prefill and the token budget --
def test_chunk_sizes_follow_the_remaining_budget() -> None:
    s = make(num_blocks=32, max_num_batched_tokens=8)
    s.add_request(req("a", [1, 2, 3], max_tokens=10, t=0))
    s.add_request(req("b", list(range(20)), max_tokens=2, t=1))
    out, _ = step(s)
    assert sched(out) == {"a": (0, 3), "b": (0, 5)}
    out, _ = step(s)
    assert sched(out) == {"a": (3, 1), "b": (5, 7)}      # decode first, the chunk gets the rest
    out, _ = step(s)
    assert sched(out) == {"a": (4, 1), "b": (12, 7)}
    out, outs = step(s)
    assert sched(out) == {"a": (5, 1), "b": (19, 1)} and {o.request_id for o in outs} == {"a", "b"}


def test_without_chunking_a_prompt_waits_for_a_step_it_fits_in() -> None:
    s = make(num_blocks=32, max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add_request(req("a", [1, 2, 3], max_tokens=3, t=0))
    s.add_request(req("b", list(range(8)), max_tokens=1, t=1))
    s.add_request(req("big", list(range(9)), max_tokens=1, t=2))   # > budget: can never run whole
    out, _ = step(s)
    assert sched(out) == {"a": (0, 3)}
    out, _ = step(s)
    assert sched(out) == {"a": (3, 1)}                  # b needs 8, only 7 left
    step(s)
    out, outs = step(s)
    assert sched(out) == {"b": (0, 8)} and "big" not in s.requests


def test_max_num_seqs() -> None:
    s = make(num_blocks=64, max_num_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", [1, 2], max_tokens=3, t=i))
    out, _ = step(s)
    assert set(sched(out)) == {"r0", "r1"}


# -- preemption --
def test_fcfs_preempts_the_latest_arrival_and_requeues_it_first() -> None:
    s = make(num_blocks=4, block_size=2, max_num_seqs=3)
    for i in range(3):
        s.add_request(req(f"r{i}", [1, 2, 3], max_tokens=4, t=i))
    step(s)
    out, _ = step(s)
    assert set(sched(out)) == {"r0", "r1"}
    r1 = s.requests["r1"]
    out, _ = step(s)                                     # r0 needs a 3rd block: r1 is the victim
    assert out.preempted_ids == ["r1"] and sched(out) == {"r0": (4, 1)}
    assert r1.status is RequestStatus.PREEMPTED and r1.num_computed_tokens == 0 and not r1.block_ids
    assert r1.output_token_ids == [7, 7] and r1.num_preemptions == 1
    assert s.waiting[0] is r1
    run(s)
    assert r1.output_token_ids == [7] * 4 and s.allocator.num_free_blocks() == 4


def test_priority_preempts_the_lowest_priority_even_if_it_came_first() -> None:
    s = make(num_blocks=4, block_size=2, max_num_seqs=3, policy="priority")
    s.add_request(req("low", [1, 2, 3], max_tokens=4, t=0, priority=5))
    s.add_request(req("high", [4, 5, 6], max_tokens=4, t=1, priority=0))
    out, _ = step(s)
    assert [x.request_id for x in out.scheduled] == ["high", "low"]
    step(s)
    out, _ = step(s)
    assert out.preempted_ids == ["low"] and sched(out) == {"high": (4, 1)}


def test_a_custom_policy_is_a_few_lines() -> None:
    class ShortestFirst(Policy):
        def sort_key(self, r: Request):
            return (r.num_prompt_tokens,)

    s = make(policy=ShortestFirst(), max_num_seqs=1)
    s.add_request(req("long", [1] * 6, t=0))
    s.add_request(req("short", [2], t=1))
    out, _ = step(s)
    assert sched(out) == {"short": (0, 1)}


# -- requests that can never run --
def test_ignored_requests_are_reported_and_the_others_go_on() -> None:
    s = make(num_blocks=4, block_size=2, max_model_len=6)
    s.add_request(req("too_long", list(range(7))))               # > max_model_len
    s.add_request(req("own_limit", list(range(3)), max_model_len=2))
    s.add_request(req("ok", [1, 2], max_tokens=2))
    assert s.has_unfinished()
    out, outs = step(s)
    assert set(out.finished_ids) == {"too_long", "own_limit"}
    rejected = {o.request_id: o.finish_reason for o in outs if o.finished}
    assert rejected == {"too_long": "rejected", "own_limit": "rejected"}
    assert sched(out) == {"ok": (0, 2)}
    s2 = make(num_blocks=2, block_size=2)
    s2.add_request(req("huge", list(range(5))))                  # needs 3 of 2 blocks
    out, outs = step(s2)
    assert outs[0].finish_reason == "rejected" and not s2.has_unfinished()


# -- stops --
def test_token_level_stops() -> None:
    s = make()
    s.add_request(req("eos", [1], max_tokens=9, ignore_eos=False, eos_token_id=3, min_tokens=2))
    s.add_request(req("stopid", [1], max_tokens=9, stop_token_ids=[3]))
    s.add_request(req("ign", [1], max_tokens=2, ignore_eos=True, eos_token_id=3))
    s.add_request(req("mml", [1, 1], max_tokens=9, max_model_len=4))
    outs = []
    for tok in (3, 3, 3):
        outs += step(s, tok)[1]
    fin = {o.request_id: (o.finish_reason, o.stop_reason) for o in outs if o.finished}
    assert fin == {"eos": ("stop", None), "stopid": ("stop", 3), "ign": ("length", None), "mml": ("length", None)}
    assert s.allocator.num_free_blocks() == 16 and not s.has_unfinished()


# -- speculative decoding --
def test_spec_rollback_frees_the_unused_tail_and_publishes_only_verified_blocks() -> None:
    s = make(num_blocks=8, block_size=2)
    r = req("a", [1, 2, 3], max_tokens=20)
    s.add_request(r)
    step(s, 5)                                               # tokens 1 2 3 5, computed 3
    r.spec_token_ids = [6, 7, 8, 9]
    out = s.schedule()
    x = out.scheduled[0]
    assert (x.start, x.num_new_tokens, x.num_spec_tokens, len(x.block_ids)) == (3, 5, 4, 4)
    free = s.allocator.num_free_blocks()
    outs = s.update(out, {"a": [6, 0]})                      # draft 6 accepted, 7 rejected, 0 sampled
    assert outs[0].new_token_ids == [6, 0] and r.output_token_ids == [5, 6, 0]
    assert r.num_computed_tokens == r.num_tokens - 1 == 5 and not r.spec_token_ids
    assert len(r.block_ids) == 3 and s.allocator.num_free_blocks() == free + 1
    assert s.allocator.num_cached_blocks() == 2               # positions 0-3; block 2 holds a rejected draft


def test_spec_stop_in_the_middle_drops_the_rest() -> None:
    s = make()
    r = req("a", [1], max_tokens=9, stop_token_ids=[4])
    s.add_request(r)
    step(s, 2)
    r.spec_token_ids = [4, 5]
    out = s.schedule()
    outs = s.update(out, {"a": [4, 5, 6]})
    assert outs[0].new_token_ids == [4] and outs[0].finish_reason == "stop" and r.output_token_ids == [2, 4]


def test_spec_tokens_capped_by_max_tokens() -> None:
    s = make()
    r = req("a", [1], max_tokens=3)
    s.add_request(r)
    step(s)
    r.spec_token_ids = [1, 2, 3, 4, 5]
    out = s.schedule()
    assert out.scheduled[0].num_spec_tokens == 1               # 1 output + 1 draft + 1 bonus = 3


def test_update_rejects_wrong_sample_counts() -> None:
    s = make()
    s.add_request(req("a", [1, 2]))
    out = s.schedule()
    with pytest.raises(ValueError, match="must hold 1 to 1 tokens"):
        s.update(out, {"a": [1, 2]})
    with pytest.raises(ValueError, match="must hold 1 to 1 tokens"):
        s.update(out, {})
    assert s.update(out, {"a": [1]})[0].new_token_ids == [1]


# -- abort --
def test_abort_frees_at_once_and_reports_in_finished_ids() -> None:
    s = make()
    s.add_request(req("a", [1, 2, 3, 4, 5]))
    out = s.schedule()
    s.abort(["a", "unknown"])
    assert s.allocator.num_free_blocks() == 16 and s.requests == {}
    assert s.update(out, {"a": [1]}) == []                   # aborted meanwhile: skipped
    assert s.schedule().finished_ids == ["a"]
    assert not s.has_unfinished()


# -- arguments --
def test_argument_errors_name_what_is_valid() -> None:
    with pytest.raises(ValueError, match="valid names"):
        make(policy="lifo")
    with pytest.raises(ValueError, match="block_size"):
        ContinuousBatchingScheduler(ReferenceAllocator(4, 4), block_size=8)
    with pytest.raises(ValueError, match="max_num_seqs"):
        make(max_num_seqs=0)
    s = make()
    s.add_request(req("a", [1]))
    with pytest.raises(ValueError, match="unique"):
        s.add_request(req("a", [2]))


def test_lookahead_slots_are_allocated() -> None:
    s = make(num_blocks=16, block_size=2, num_lookahead_tokens=4)
    s.add_request(req("a", [1, 2, 3], max_tokens=8))
    out = s.schedule()
    assert len(out.scheduled[0].block_ids) == 4                # 3 tokens + 4 lookahead slots
