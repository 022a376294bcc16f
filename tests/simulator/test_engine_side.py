"""The harness on the real engine (a tiny random Llama on the CPU): policies through LLM,
a trace run and recorded, its replay on the simulator, and the profile the fit reads."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.schedulers import VTC
from toolkit.simulator import FEATURES, CostModel, Simulator, make_trace, synthetic_lengths
from toolkit.simulator.calibrate import profile_admission, profile_engine
from toolkit.simulator.replay import TraceRecorder, run_on_engine

CFG = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=128, max_position_embeddings=512, eos_token_id=2)


@pytest.fixture(scope="module")
def llm():
    with LLM(CFG, device="cpu", dtype="float32", num_blocks=128, block_size=16, max_num_seqs=8,
             max_num_batched_tokens=128) as m:
        yield m


def test_policy_by_name_with_request_fields_through_generate(llm) -> None:
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.engine.scheduler.set_policy("vtc")
    try:
        # no client_id: one shared client (issue 54: VTC refused every request without one)
        assert len(llm.generate([[5, 6, 7]], sp, use_tqdm=False)[0].outputs[0].token_ids) == 3
        assert llm.engine.scheduler.policy.counters[None] > 0 and not llm.engine.has_unfinished()
        outs = llm.generate([[5, 6, 7], [8, 9]], sp, client_id=["a", "b"], use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outs] == [3, 3]
        assert isinstance(llm.engine.scheduler.policy, VTC) and llm.engine.scheduler.policy.counters["b"] > 0
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            llm.generate([[5, 6]], sp, client_id="a", priorities=[2], use_tqdm=False)
        assert any("ignores priorities" in str(x.message) for x in w)
    finally:
        llm.engine.scheduler.set_policy("fcfs")


def test_trace_on_the_engine_is_recorded_and_replays_on_the_simulator(llm, tmp_path) -> None:
    trace = make_trace(synthetic_lengths(6, seed=1, prompt_median=20, output_median=5, max_prompt=40,
                                         max_total=60), rate=1e6, vocab_size=128)
    real = run_on_engine(llm, trace, realtime=False)
    for r in trace.requests:
        t = real.requests[r.request_id]
        assert t.finish is not None and len(t.token_times) == r.output_len
    assert sum(s.prefill_tokens for s in real.steps) >= sum(r.prompt_len for r in trace.requests) - 16 * 6
    rec = real.recording
    back = rec.trace()
    assert sorted((r.prompt_ids, r.output_len) for r in back.requests) == \
        sorted((r.prompt_ids, r.output_len) for r in trace.requests)
    rec.steps[0].wait = 0.25                  # the CPU waits on no device: set one to round-trip
    rec.save(tmp_path / "rec.json")
    loaded = TraceRecorder.load(tmp_path / "rec.json")
    assert [s.wait for s in loaded.steps] == [s.wait for s in rec.steps]
    assert [s.features.tolist() for s in loaded.steps] == [s.features.tolist() for s in rec.steps]
    assert [r.prompt_ids for r in loaded.trace().requests] == [r.prompt_ids for r in back.requests]
    assert [s.grants for s in loaded.steps] == [s.grants for s in rec.steps]
    # each step's call time and the driver's time until the next call (the last has none)
    assert all(s.period > 0 for s in rec.steps) and all(s.gap >= 0 for s in rec.steps[:-1])
    assert [s.gap for s in loaded.steps] == [s.gap for s in rec.steps]
    assert real.host_time["steps"] >= len(rec.steps) and real.host_time["add_s"] > 0
    assert all(t.admitted is not None and 0 <= t.admission_wait <= t.ttft for t in real.requests.values())
    cost = CostModel({"const": 1e-3})
    sim = Simulator("fcfs", cost, num_blocks=128, block_size=16, max_num_seqs=8, max_num_batched_tokens=128,
                    vocab_size=128).run(back)
    assert sum(len(t.token_times) for t in sim.requests.values()) == \
        sum(len(t.token_times) for t in real.requests.values())
    # the same scheduler settings and arrivals at once: the simulated plan is the engine's
    assert [s.decode_seqs for s in sim.steps] == [s.decode_seqs for s in real.steps]
    assert [s.prefill_tokens for s in sim.steps] == [s.prefill_tokens for s in real.steps]


def test_profile_gives_one_sample_per_shape_with_the_shape_in_its_features(llm) -> None:
    samples = profile_engine(llm, decode=[(4, 20), (8, 40)], prefill=[30, 100, (10, 3)],
                             mixed=[(4, 20, 50), (2, 20, 10, 3)], steps=3, warmup=1)
    assert not llm.engine.has_unfinished() and not llm.engine.scheduler.requests
    feats = np.stack([x for x, _ in samples])
    assert feats[:, 2].tolist() == [4, 8, 0, 0, 0, 4, 2]            # decode sequences
    assert feats[:, 1].tolist() == [0, 0, 30, 100, 30, 50, 30]      # prefill tokens
    assert feats[:, 5].tolist() == [0, 0, 1, 1, 3, 1, 3]            # prompt chunks
    assert llm.engine.runner.graph_tokens is None and not feats[:, 6].any()   # no graphs: none eager
    assert all(y > 0 for _, y in samples)
    adm = profile_admission(llm, lengths=(8, 400), repeats=3)
    assert not llm.engine.has_unfinished() and adm["per_token"] > 0 and adm["per_request"] >= 0
    with pytest.raises(ValueError, match="at least"):
        CostModel.fit(samples[:2])


def test_recorder_detaches_and_refits(llm) -> None:
    rec = TraceRecorder(llm)
    rec.graph_tokens = 16          # as if the engine replayed steps of <= 16 tokens from CUDA graphs
    llm.generate([[3] * 40, [4] * 20, [5] * 10] * 2, SamplingParams(max_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    rec.detach()
    assert rec not in llm.engine.observers and len(rec.steps) >= 8
    eager = [s.features[FEATURES.index("eager_steps")] for s in rec.steps]
    assert eager == [float(sum(s.grants.values()) > 16) for s in rec.steps] and 0 < sum(eager) < len(eager)
    m = rec.fit_cost(skip=0, window=2)
    assert m.fit_error["samples"] == len(rec.steps) - 1 and m.coef["const"] >= 0
    assert m.graph_tokens == 16


def test_llm_takes_a_policy_by_name_class_or_instance_and_refuses_one_that_cannot_reach() -> None:
    from toolkit.schedulers import SJF, Priority

    class Mine:                       # duck-typed: sort_key and victim only
        def sort_key(self, r):
            return (-r.num_prompt_tokens,)

        def victim(self, running):
            return running[-1]

    mine = Mine()
    kw = dict(device="cpu", dtype="float32", num_blocks=32)
    assert isinstance(LLM(CFG, policy="sjf_output", **kw).engine.scheduler.policy, SJF)
    assert LLM(CFG, policy=Priority, **kw).engine.scheduler.policy.uses_priority
    p = Priority(aging=2.0)
    assert LLM(CFG, policy=p, **kw).engine.scheduler.policy is p
    assert LLM(CFG, policy=mine, **kw).engine.scheduler.policy.wrapped is mine
    with pytest.raises(ValueError, match="did not reach scheduler ReferenceScheduler"):
        LLM(CFG, scheduler="reference", policy="priority", **kw)
    with pytest.raises(ValueError, match="policy must be one of"):
        LLM(CFG, policy="lifo", **kw)
    with pytest.raises(TypeError, match="EngineConfig.policy"):
        LLM(CFG, policy=3, **kw)


@pytest.mark.parametrize("async_scheduling,after", [(False, 1), (True, 2)])
def test_engine_steps_from_admission_to_first_token(async_scheduling, after) -> None:
    """run_on_engine counts the step() calls: a request added to an idle engine gets its first
    token from the next call (synchronous), or the one after (async scheduling returns a
    step's tokens from the call that launched the next one): what the simulator's
    async_output mirrors (the engine's side of test_steps_from_admission_to_first_token)."""
    trace = make_trace(synthetic_lengths(3, seed=2, prompt_median=12, output_median=4, max_prompt=20,
                                         max_total=40), rate=1e6, vocab_size=128)
    with LLM(CFG, device="cpu", dtype="float32", num_blocks=64, block_size=16, max_num_seqs=8,
             max_num_batched_tokens=128, async_scheduling=async_scheduling) as m:
        real = run_on_engine(m, trace, realtime=False)
    for t in real.requests.values():
        assert t.admitted_step == 0 and t.first_token_step - t.admitted_step == after
