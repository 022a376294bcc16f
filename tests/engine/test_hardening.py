"""Regression tests of the hardening review: each failed before its fix.

The tiny random Llama (no tokenizer: prompts are token ids), on the CPU."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit import LLM, SamplingParams
from toolkit.blocks.free_list import FreeListAllocator
from toolkit.samplers.pipeline import Sampler
from toolkit.schedulers.continuous import ContinuousBatchingScheduler

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             max_model_len=96) as llm:
        yield llm


def _clean(llm) -> None:
    e = llm.engine
    assert not e.has_unfinished(), "requests left queued"
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks, "KV blocks leaked"


class _FailsOnce(Sampler):
    """A sampler that raises on its `when`-th call."""

    def __init__(self, when: int) -> None:
        super().__init__()
        self.calls, self.when = 0, when

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == self.when:
            raise RuntimeError("boom")
        return super().__call__(*a, **k)


def test_rejection_report_survives_a_failed_step(tiny_llama_dir):
    """A request that can never fit is reported "rejected" even when the step that would
    have reported it raises; nothing hangs."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             enable_chunked_prefill=False, max_num_batched_tokens=32, sampler=_FailsOnce(2)) as llm:
        e = llm.engine
        e.add_request([5, 6, 7], GREEDY)
        e.step()
        e.add_request([9] * 40, GREEDY, request_id="big")    # > 32 tokens, no chunking: never fits
        with pytest.raises(RuntimeError, match="boom"):
            e.step()
        outs = []
        for _ in range(20):
            if not e.has_unfinished():
                break
            outs += e.step()
        assert not e.has_unfinished(), "hung: a report was lost"
        big = [o for o in outs if o.request_id == "big"]
        assert big and big[0].outputs[0].finish_reason == "rejected"
        _clean(llm)


def test_generate_is_all_or_nothing_after_a_failed_step(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             sampler=_FailsOnce(2)) as llm:
        with pytest.raises(RuntimeError, match="boom"):
            llm.generate([[5, 6, 7], [8, 9], [10]], GREEDY, use_tqdm=False)
        _clean(llm)
        out = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
        assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("bad", [
    dict(arrival_time="x"), dict(arrival_time=float("nan")), dict(priority=None), dict(priority=1.5),
])
def test_bad_request_fields_refused_at_add(llm, bad):
    field = next(iter(bad))
    with pytest.raises((TypeError, ValueError), match=field):
        llm.engine.add_request([5], GREEDY, **bad)
    _clean(llm)
    assert len(llm.generate([[5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("prompts, match", [
    ([[5, 6], [1, None]], "token ids"), ([[1.9, 2.9]], "float"), ([[True, 2]], "bool"),
    (None, "None"), ([[5, 6], "text"], "tokenizer"),
])
def test_bad_prompts_refused_and_nothing_queued(llm, prompts, match):
    with pytest.raises((TypeError, ValueError), match=match):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    _clean(llm)


def test_arrays_and_tensors_are_prompts(llm):
    ids = [5, 6, 7, 8]
    want = llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    for p in (np.asarray(ids), torch.tensor(ids), np.asarray([ids]), tuple(ids)):
        outs = llm.generate(p, GREEDY, use_tqdm=False)
        assert outs[0].outputs[0].token_ids == want
    with pytest.raises(TypeError, match="integers"):
        llm.generate(np.asarray([1.0, 2.0]), GREEDY, use_tqdm=False)


@pytest.mark.parametrize("ids, want", [
    ([5, 6, 7], [5, 6, 7]), ((5, 6), [5, 6]), ([], []),
    ([np.int64(5), 6], [5, 6]),                       # a numpy scalar among ints: the general path
    ([np.int32(5), np.uint8(6)], [5, 6]),
    (np.asarray([5, 6], dtype=np.uint16), [5, 6]), (torch.tensor([5, 6]), [5, 6]),   # arrays: tolist()
])
def test_token_id_list_accepts_integers_of_any_kind(ids, want):
    from toolkit.types import token_id_list

    out = token_id_list(ids)
    assert out == want and all(type(t) is int for t in out)
    assert out is not ids                             # a copy: the caller's list may change later


@pytest.mark.parametrize("ids", [[1, True], [False], [1, 2.0], (1, None), [1, "2"], [1, np.float32(2)]])
def test_token_id_list_refuses_what_is_not_an_integer(ids):
    from toolkit.types import token_id_list

    with pytest.raises(TypeError, match="integer token ids"):
        token_id_list(ids)


def test_engine_add_request_fans_out_n(llm):
    e = llm.engine
    rid = e.add_request([5, 6, 7], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=5,
                                                  ignore_eos=True))
    final = None
    while e.has_unfinished():
        for o in e.step():
            assert o.request_id == rid and len(o.outputs) == 3
            final = o
    assert final.finished and [c.index for c in final.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 5 for c in final.outputs)
    _clean(llm)


def test_aborted_rejected_id_can_be_reused(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             enable_chunked_prefill=False, max_num_batched_tokens=32) as llm:
        e = llm.engine
        e.add_request([9] * 40, GREEDY, request_id="x")       # rejected at the scheduler
        e.abort("x")
        e.add_request([9, 9], GREEDY, request_id="x")
        outs = [o for _ in range(10) for o in e.step()]
        assert [o.outputs[0].finish_reason for o in outs if o.finished] == ["length"]
        _clean(llm)


@pytest.mark.parametrize("kw, err, match", [
    (dict(allocator=123), ValueError, "allocator=123"),
    (dict(scheduler=None), ValueError, "scheduler=None"),
    (dict(sampler=None), ValueError, "sampler=None"),
    (dict(seed=None), TypeError, "seed"),
    (dict(num_blocks="8"), TypeError, "num_blocks"),
    (dict(allocator=FreeListAllocator(7, 4)), ValueError, "allocator has 7 blocks"),
    (dict(scheduler=object()), ValueError, "lacks"),
])
def test_bad_parts_refused_at_construction(tiny_llama_dir, kw, err, match):
    base = dict(dtype="float32", device="cpu", num_blocks=24, block_size=4)
    with pytest.raises(err, match=match):
        LLM(tiny_llama_dir, **{**base, **kw})


def test_scheduler_factory_partial(tiny_llama_dir):
    part = functools.partial(ContinuousBatchingScheduler, max_num_seqs=2)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4,
             scheduler=part) as llm:
        assert llm.engine.scheduler.max_num_seqs == 2
        assert len(llm.generate([[5], [6], [7]], GREEDY, use_tqdm=False)) == 3


def test_closed_llm_and_dict_params_say_what_to_do(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=24, block_size=4)
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate([[5]], {"temperature": 0}, use_tqdm=False)
    llm.close()
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate([[5]], GREEDY, use_tqdm=False)


def test_long_prefill_reports_progress(tiny_llama_dir, monkeypatch):
    """The bar moves during a chunked prefill, before the first output token."""
    import toolkit.progress as progress

    ticks = []

    class Bar:
        def update(self, n=1):
            ticks.append(n)

    monkeypatch.setattr(progress, "progress_bar", lambda **k: _nullcm(Bar()))
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4,
             max_num_batched_tokens=16) as llm:
        llm.generate([[5] * 90], SamplingParams(max_tokens=2, ignore_eos=True))
    assert ticks[:5] == [16] * 5, ticks               # prefill chunks of 16 tokens
    assert sum(ticks) == 90 + 2


class _nullcm:
    def __init__(self, v):
        self.v = v

    def __enter__(self):
        return self.v

    def __exit__(self, *a):
        return None


_FIELDS = {
    "temperature": st.one_of(st.text(max_size=3), st.just(float("nan")), st.floats(max_value=-0.01)),
    "top_p": st.one_of(st.floats(min_value=1.01, max_value=5), st.just(0.0), st.text(max_size=2)),
    "top_k": st.one_of(st.integers(max_value=-2), st.floats(allow_nan=False), st.just("3")),
    "max_tokens": st.one_of(st.integers(max_value=0), st.floats(1, 5), st.just(None)),
    "logit_bias": st.one_of(st.just({1: float("nan")}), st.just({-1: 1.0}), st.just([1, 2])),
    "stop": st.one_of(st.just([""]), st.just([1]), st.just(5)),
    "seed": st.one_of(st.floats(allow_nan=False), st.just("1")),
    "n": st.one_of(st.integers(max_value=0), st.just(2.0)),
    "min_p": st.one_of(st.floats(min_value=1.01, max_value=3), st.just(float("nan"))),
    "ignore_eos": st.one_of(st.just(1), st.just("yes")),
    "allowed_token_ids": st.one_of(st.just([]), st.just([-1]), st.just("1")),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_bad_sampling_field_names_itself(llm, data):
    field = data.draw(st.sampled_from(sorted(_FIELDS)))
    value = data.draw(_FIELDS[field])
    with pytest.raises((TypeError, ValueError), match=field):
        llm.generate([[5, 6]], SamplingParams(**{field: value}), use_tqdm=False)
    _clean(llm)


def test_step_observer_records_what_the_step_did(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4,
             max_num_batched_tokens=8) as llm:
        recs = []
        llm.engine.add_observer(recs.append)
        llm.generate([[5] * 10, [6, 7]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
        llm.engine.remove_observer(recs.append)
        assert [r.step for r in recs] == list(range(len(recs)))
        first = recs[0]
        assert first.grants == {"0": 8} and first.num_prefill_tokens == 8 and first.num_waiting == 1
        assert sum(r.num_prefill_tokens + r.num_decode_tokens for r in recs) == sum(
            sum(r.grants.values()) for r in recs)
        assert sum(r.num_finished for r in recs) == 2 and recs[-1].num_running == 0
        assert all(0 < r.kv_blocks_used <= 64 for r in recs[:-1]) and all(r.duration > 0 for r in recs)
        assert all(r.gpu_time is None for r in recs), "no GPU time unless asked for (and on the CPU)"
        assert all(r.wait_time is None for r in recs), "the CPU's tokens never wait on a device"
        assert llm.engine.runner.time_gpu is False, "steps are timed only for an observer that asks"
        n = len(recs)
        llm.generate([[5]], SamplingParams(max_tokens=2), use_tqdm=False)
        assert len(recs) == n, "a removed observer is not called"
        llm.engine.add_observer(recs.append, gpu_time=True)
        llm.engine.add_observer(print)
        assert llm.engine.runner.time_gpu is True
        llm.engine.remove_observer(recs.append)
        assert llm.engine.runner.time_gpu is False, "the observer left attached did not ask"
        llm.engine.remove_observer(print)


def test_stop_string_frees_blocks_in_the_step_it_is_found(tiny_llama_dir):
    """The sequence a stop string finishes leaves the scheduler (blocks freed) in that very
    step, not when the run ends."""
    from toolkit.models import default_model_path, load_tokenizer

    tok = load_tokenizer(default_model_path())      # ids < 517 decode to ordinary text
    with LLM(tiny_llama_dir, tokenizer=tok, dtype="float32", device="cpu", num_blocks=32,
             block_size=4, enable_prefix_caching=False) as llm:
        p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        full = llm.generate([[5, 6, 7]], p, use_tqdm=False)[0].text
        stop = full[len(full) // 2: len(full) // 2 + 2]
        assert stop.strip(), full
        e = llm.engine
        rid = e.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))
        other = e.add_request([8, 9], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        while True:
            outs = {o.request_id: o for o in e.step()}
            if rid in outs and outs[rid].finished:
                break
        assert outs[rid].outputs[0].finish_reason == "stop" and outs[rid].text == full[: full.index(stop)]
        assert rid not in e.scheduler.requests
        held = {b for r in e.scheduler.requests.values() for b in r.block_ids}
        assert e.allocator.num_free_blocks() == 32 - len(held), "the stopped request still holds blocks"
        e.abort(other)


def test_schema_error_names_the_problem_not_the_library():
    from toolkit.samplers.grammar import Structured

    with pytest.raises(ValueError) as err:
        SamplingParams(structured=Structured.json({"foo": "bar"}))
    assert "open an issue" not in str(err.value) and "schema" in str(err.value)


def test_sample_ids_cannot_collide_and_abort_the_whole_request(llm):
    e = llm.engine
    p = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=3, ignore_eos=True)
    e.add_request([5, 6], p, request_id="x")
    with pytest.raises(ValueError, match="in use"):
        e.add_request([7], GREEDY, request_id="x#0")
    e.add_request([8], GREEDY, request_id="y")
    e.abort("x#1")                                # a sample's id aborts its whole request
    outs = [o for _ in range(20) for o in e.step()]
    assert {o.request_id for o in outs if o.finished} == {"y"}
    _clean(llm)


def test_prompt_logprobs_with_a_reused_id_compute_every_position(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4) as llm:
        for _ in range(2):
            e = llm.engine
            e.add_request(list(range(10, 30)), SamplingParams(max_tokens=1, prompt_logprobs=1),
                          request_id="same")
            final = [o for _ in range(10) for o in e.step() if o.finished][0]
            assert final.prompt_logprobs[0] is None and all(x is not None for x in final.prompt_logprobs[1:])


def test_infinite_bias_and_numpy_int_lists(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={5: float("inf")})
    ids = list(np.asarray([5, 6, 7]))              # numpy ints in a list: one prompt
    assert len(llm.generate(ids, GREEDY, use_tqdm=False)) == 1


def test_a_late_grammar_failure_rejects_the_whole_request(tiny_llama_dir, monkeypatch):
    """A compile error found only by the full compile (after add_request) finishes the user
    request, all its samples, with "rejected"; nothing stays queued."""
    from toolkit.models import default_model_path, load_tokenizer
    from toolkit.samplers.grammar import Structured

    tok = load_tokenizer(default_model_path())
    with LLM(tiny_llama_dir, tokenizer=tok, dtype="float32", device="cpu", num_blocks=32, block_size=4) as llm:
        e = llm.engine
        sm = e.structured
        real = sm.take_compiled
        calls = []

        def fail_first(*a):
            ready, failed = real()
            if not calls and ready:
                calls.append(1)
                return ready[1:], failed + [(ready[0], "the DFA could not be built")]
            return ready, failed
        monkeypatch.setattr(sm, "take_compiled", fail_first)
        rid = e.add_request([5, 6], SamplingParams(n=2, max_tokens=3, structured=Structured.regex("[0-9]+")))
        outs = []
        for _ in range(2000):
            outs += [o for o in e.step() if o.request_id == rid]
            if not e.has_unfinished():
                break
        assert [o.outputs[0].finish_reason for o in outs] == ["rejected"] and len(outs[0].outputs) == 2
        assert e.allocator.num_free_blocks() == 32 and not sm.grammars and not e._host_tokens
