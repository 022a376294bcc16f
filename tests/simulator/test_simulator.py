"""The simulator: cost model fit and data, traces, the virtual clock over the real
scheduler, metrics, and policies compared on it (deterministic: no wall clock)."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.schedulers import ContinuousBatchingScheduler
from toolkit.schedulers.simulate import simulate
from toolkit.simulator import (
    FEATURES,
    CostModel,
    RequestTiming,
    RunResult,
    Simulator,
    Trace,
    TraceRequest,
    gamma_arrivals,
    jain_index,
    make_trace,
    multi_client_trace,
    poisson_arrivals,
    step_features,
    summarize,
    synthetic_lengths,
)
from toolkit.simulator.cost import as_features
from toolkit.simulator.metrics import max_min_shares
from toolkit.types import SchedulerOutput


def const(c: float):
    return lambda out: c


# -- cost model --
def test_fit_recovers_a_linear_model_and_refuses_negative_terms(tmp_path) -> None:
    rng = np.random.default_rng(0)
    true = np.array([2e-3, 1e-5, 5e-5, 2e-7, 0.0, 3e-4, 9e-3, 4e-5, 6e-5])
    X = np.column_stack([np.ones(40), rng.integers(0, 8192, 40), rng.integers(0, 256, 40),
                         rng.integers(0, 500_000, 40), rng.integers(0, 3000, 40),
                         rng.integers(0, 8, 40), rng.integers(0, 2, 40),
                         rng.integers(0, 60, 40), rng.uniform(0, 32, 40)]).astype(float)
    m = CostModel.fit(zip(X, X @ true))
    assert np.allclose([m.coef[f] for f in FEATURES[:len(true)]], true, rtol=1e-6, atol=1e-12)
    assert all(m.coef[f] == 0.0 for f in FEATURES[len(true):])    # features absent from the vectors
    assert m.fit_error["max_rel"] < 1e-6
    m.save("dev/shape", tmp_path / "c.json")
    assert CostModel.load("dev/shape", tmp_path / "c.json").coef == m.coef
    with pytest.raises(ValueError, match=r"available: \['dev/shape'\]"):
        CostModel.load("other", tmp_path / "c.json")
    with pytest.raises(ValueError, match="at least"):
        CostModel.fit([(X[0], 1.0)])
    with pytest.raises(ValueError, match=">= 0"):
        CostModel({"const": -1.0})
    # y = 1 - 0.5 * decode_seqs + ...: least squares would go negative; nnls keeps >= 0
    # (five columns: a vector recorded before prefill_seqs existed reads as prefill_seqs = 0)
    Xn = np.column_stack([np.ones(10), np.zeros(10), np.arange(10), np.zeros(10), np.zeros(10)])
    assert all(v >= 0 for v in CostModel.fit(zip(Xn, 1.0 - 0.05 * np.arange(10))).coef.values())


def test_steps_past_the_cuda_graphs_are_eager_steps(tmp_path) -> None:
    """A step of more tokens than the engine's largest CUDA graph runs eagerly: it counts
    as one eager step (the 8B on the H200: 17-21 ms for 129-512 tokens, 5.4 ms for 128), the
    limit travels with the model, and a model without one (CPU: no graphs) never counts."""
    from toolkit.types import Request, SamplingParams, ScheduledRequest

    def chunk(rid, n):
        return ScheduledRequest(Request(rid, list(range(n)), SamplingParams()), 0, n, [0])

    eager = FEATURES.index("eager_steps")
    big, small = SchedulerOutput([chunk("a", 100), chunk("b", 29)]), SchedulerOutput([chunk("c", 128)])
    assert step_features(big, 128)[eager] == 1.0
    assert step_features(small, 128)[eager] == 0.0            # exactly the largest graph: replayed
    assert step_features(big)[eager] == 0.0 and step_features(big, 129)[eager] == 0.0
    m = CostModel({"const": 0.005, "prefill_tokens": 1e-5, "eager_steps": 0.01}, graph_tokens=128)
    assert m(big) == pytest.approx(0.005 + 129e-5 + 0.01)
    assert m(small) == pytest.approx(0.005 + 128e-5)
    m.save("dev/shape", tmp_path / "c.json")
    back = CostModel.load("dev/shape", tmp_path / "c.json")
    assert back.graph_tokens == 128 and back(big) == pytest.approx(m(big))
    assert "graph_tokens=128" in repr(back)
    # fitted from plans: the flag counted with the given limit, which the model keeps
    plans = [SchedulerOutput([chunk(f"r{n}", n)]) for n in (32, 64, 128, 192, 256, 512)]
    secs = [0.005 + 1e-5 * n + (0.01 if n > 128 else 0.0) for n in (32, 64, 128, 192, 256, 512)]
    fit = CostModel.fit(zip(plans, secs), graph_tokens=128, features=("const", "prefill_tokens", "eager_steps"))
    assert fit.graph_tokens == 128 and fit.coef["eager_steps"] == pytest.approx(0.01, rel=1e-6)


def test_a_prompt_chunk_beside_decodes_is_the_mixed_feature() -> None:
    """mixed_ktokens = prompt tokens x decodes / 1000 in a step replayed from graphs; 0 in an
    eager step (eager_steps has it) and in a step with no decode or no prompt chunk."""
    from toolkit.types import Request, SamplingParams, ScheduledRequest

    def chunk(rid, n):
        return ScheduledRequest(Request(rid, list(range(n)), SamplingParams()), 0, n, [0])

    def decode(rid, ctx):           # one token after a ctx-token prompt
        return ScheduledRequest(Request(rid, list(range(ctx)), SamplingParams()), ctx, 1, [0])

    mixed = FEATURES.index("mixed_ktokens")
    step = SchedulerOutput([chunk("p", 300), *(decode(f"d{i}", 40) for i in range(120))])
    assert step_features(step, 512)[mixed] == pytest.approx(300 * 120 / 1000)
    assert step_features(step)[mixed] == pytest.approx(36.0)                  # no graphs: not eager
    assert step_features(step, 256)[mixed] == 0.0                            # 420 tokens: eager
    assert step_features(SchedulerOutput([chunk("p", 300)]), 512)[mixed] == 0.0
    assert step_features(SchedulerOutput([decode("d", 40)]), 512)[mixed] == 0.0
    m = CostModel({"const": 0.005, "mixed_ktokens": 1e-4}, graph_tokens=512)
    assert m(step) == pytest.approx(0.005 + 36 * 1e-4)
    # a vector recorded before the feature: a window (a sum of steps) reads it as 0; one
    # step's, or the mean of identical steps', gets it from its prompt tokens and decodes
    old = step_features(step, 512)[:7]
    assert as_features(old)[mixed] == 0.0
    assert as_features(old, one_step=True)[mixed] == pytest.approx(36.0)
    old_eager = step_features(step, 256)[:7]
    assert as_features(old_eager, one_step=True)[mixed] == 0.0
    assert np.allclose(as_features(np.stack([old, old_eager]), one_step=True)[:, mixed], [36.0, 0.0])

def test_prompt_chunks_are_a_feature_and_admission_is_charged_on_the_clock() -> None:
    from toolkit.types import Request, SamplingParams, ScheduledRequest

    def sched(rid, n_prompt, start, n):
        return ScheduledRequest(Request(rid, list(range(n_prompt)), SamplingParams()), start, n, [0])

    dec = sched("d", 4, 4, 1)
    dec.request.output_token_ids.append(7)           # a decode: one token past its prompt
    out = SchedulerOutput([sched("a", 30, 0, 30), sched("b", 50, 16, 34), dec])
    assert step_features(out)[FEATURES.index("prefill_seqs")] == 2
    assert step_features(out)[FEATURES.index("prefill_tokens")] == 64
    cost = CostModel({"const": 0.5}, admission={"per_request": 0.1, "per_token": 0.01})
    assert cost.admission_time(10) == pytest.approx(0.2)
    assert CostModel.from_dict(cost.to_dict()).admission == cost.admission
    with pytest.raises(ValueError, match="per_token"):
        CostModel({"const": 0.5}, admission={"per_tokens": 0.1})
    trace = Trace([TraceRequest("a", 0.0, list(range(10)), 3), TraceRequest("b", 0.75, list(range(20, 40)), 1)])
    run = Simulator("fcfs", cost, num_blocks=64, block_size=4).run(trace)
    a, b = run.requests["a"], run.requests["b"]
    # a: added at 0.2 (0.1 + 10 x 0.01), steps of 0.5; b arrives at 0.75, during a's second
    # step, and is added when it ends (1.2), 0.3 s of admission later: a's third step too
    assert a.admitted == pytest.approx(0.2) and a.token_times == pytest.approx([0.7, 1.2, 2.0])
    assert b.admitted == pytest.approx(1.5) and b.admission_wait == pytest.approx(0.75)
    assert b.token_times == pytest.approx([2.0])


def test_window_sums_undo_a_one_step_shift_of_step_times() -> None:
    from toolkit.simulator.replay import RecordedStep, TraceRecorder
    from toolkit.simulator.result import StepLog

    # decodes with a prompt every 5th step, and each prompt's time paid in the call before
    # its record (what async launching does): step by step the fit misplaces it
    rng = np.random.default_rng(1)
    true = np.array([5e-3, 2e-5, 4e-5, 0.0, 0.0, 0.0])
    feats = [np.array([1.0, rng.integers(50, 600) * (i % 5 == 0), rng.integers(8, 40), 0, 0, float(i % 5 == 0)])
             for i in range(1000)]
    secs = [float(f @ true) for f in feats]
    secs = secs[1:] + secs[:1]                              # step i's time lands on record i - 1
    rec = TraceRecorder()
    log = StepLog(0.0, 0.0, 0, 0, 0, 0, 0, 0, 1)
    rec.steps = [RecordedStep(0.0, y, x, {}, log, y) for x, y in zip(feats, secs)]
    per_step = rec.fit_cost(skip=0, window=1)
    windowed = rec.fit_cost(skip=0, window=32)
    assert windowed.fit_error["samples"] == 1000 - 31
    assert windowed.coef["prefill_tokens"] == pytest.approx(2e-5, rel=0.2)
    assert windowed.coef["const"] == pytest.approx(5e-3, rel=0.1)
    assert per_step.coef["prefill_tokens"] < 0.5e-5      # the shifted per-step fit loses it
    with pytest.raises(ValueError, match="window"):
        rec.window_samples(0)


def test_shipped_cost_models_load() -> None:
    keys = CostModel.available()
    assert keys, "toolkit/simulator/data/cost_models.json ships at least one measured model"
    for k in keys:
        m = CostModel.load(k)
        assert m.coef["const"] >= 0 and m.fit_error.get("samples", 0) >= len(FEATURES)


# -- traces --
def test_arrival_processes_have_their_rate_and_burstiness() -> None:
    p = np.diff(poisson_arrivals(4000, 5.0, seed=1))
    g = np.diff(gamma_arrivals(4000, 5.0, cv=3.0, seed=1))
    assert abs(p.mean() - 0.2) < 0.02 and abs(p.std() / p.mean() - 1.0) < 0.1
    assert abs(g.mean() - 0.2) < 0.04 and abs(g.std() / g.mean() - 3.0) < 0.5


def test_traces_round_trip_and_carry_clients_and_shared_prompts(tmp_path) -> None:
    lengths = synthetic_lengths(400, seed=2)
    assert "synthetic" in lengths.label
    t = multi_client_trace(lengths, {"a": 1.0, "b": 3.0}, vocab_size=100, system_prompt_len=16)
    share = sum(r.client_id == "b" for r in t.requests) / len(t)
    assert 0.68 < share < 0.82
    assert all(r.prompt_ids[:16] == t.requests[0].prompt_ids[:16]
               for r in t.requests if r.client_id == t.requests[0].client_id)
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert [(r.request_id, r.arrival, r.prompt_ids, r.client_id) for r in back.requests] == \
        [(r.request_id, r.arrival, r.prompt_ids, r.client_id) for r in t.requests]
    s = make_trace(synthetic_lengths(50), rate=2.0, system_prompts=2, system_prompt_len=32, vocab_size=100)
    assert len({tuple(r.prompt_ids[:32]) for r in s.requests}) == 2


# -- the virtual clock --
def test_constant_cost_gives_exact_latencies() -> None:
    trace = Trace([TraceRequest("a", 0.0, list(range(10)), 5), TraceRequest("b", 100.0, list(range(20, 30)), 1)])
    run = Simulator("fcfs", const(0.5), num_blocks=64, block_size=4).run(trace)
    a, b = run.requests["a"], run.requests["b"]
    assert a.ttft == 0.5 and a.e2e == 2.5 and a.tpot == 0.5 and a.itls == [0.5] * 4
    assert b.ttft == 0.5 and b.finish == 100.5           # the clock jumped to b's arrival
    assert len(run.steps) == 6 and run.steps[0].prefill_tokens == 10 and run.steps[1].decode_seqs == 1


def test_simulator_matches_the_plain_simulate_loop() -> None:
    """The same scheduler, the same step cost: the harness's clock and the old loop agree."""
    trace = make_trace(synthetic_lengths(40, seed=3, max_prompt=60, max_total=120), rate=50.0, vocab_size=64)
    cost = lambda out: 0.01 + 1e-4 * out.total_num_scheduled_tokens  # noqa: E731
    run = Simulator("fcfs", cost, num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                    vocab_size=64).run(trace)
    sched = ContinuousBatchingScheduler(PrefixCachingAllocator(64, 4), block_size=4, max_num_seqs=8,
                                        max_num_batched_tokens=64)
    ref = simulate(sched, [(r.arrival, r.to_request()) for r in trace.requests], step_cost=cost, vocab_size=64)
    for rid, r in ref.items():
        assert run.requests[rid].finish == pytest.approx(r.finished_time)
        assert run.requests[rid].ttft == pytest.approx(r.time_to_first_token)
    assert run.num_preemptions > 0          # the small cache did preempt: the case is not trivial


def test_prefix_caching_and_lpm_show_up_in_the_simulation() -> None:
    trace = make_trace(synthetic_lengths(60, seed=4, max_prompt=64), rate=200.0, system_prompts=3,
                       system_prompt_len=64, vocab_size=200)
    cost = CostModel({"const": 1e-3, "prefill_tokens": 1e-5, "decode_seqs": 1e-5})
    kw = dict(num_blocks=256, block_size=16, max_num_seqs=4, max_num_batched_tokens=256)
    runs = {name: Simulator(p, cost, enable_prefix_caching=pc, **kw).run(trace)
            for name, p, pc in (("nocache", "fcfs", False), ("fcfs", "fcfs", True), ("lpm", "lpm", True))}
    prefill = {k: sum(s.prefill_tokens for s in r.steps) for k, r in runs.items()}
    assert prefill["fcfs"] < prefill["nocache"] and prefill["lpm"] <= prefill["fcfs"]


def test_vtc_is_fairer_than_fcfs_to_a_light_client_under_overload() -> None:
    lengths = synthetic_lengths(300, seed=5, prompt_median=40, output_median=40, max_prompt=128, max_total=256)
    trace = multi_client_trace(lengths, {"light": 2.0, "heavy": 40.0}, vocab_size=500, seed=5)
    cost = CostModel({"const": 0.02, "prefill_tokens": 2e-5, "decode_seqs": 2e-4})
    kw = dict(num_blocks=512, block_size=16, max_num_seqs=16, max_num_batched_tokens=512)
    runs = {p: Simulator(p, cost, **kw).run(trace) for p in ("fcfs", "vtc")}
    fcfs, vtc = (summarize(runs[p]) for p in ("fcfs", "vtc"))
    assert vtc["jain_fairness"] > fcfs["jain_fairness"] + 0.05
    ttft = {p: np.mean([r.ttft for r in run.requests.values() if r.client_id == "light"]) for p, run in runs.items()}
    assert ttft["vtc"] < ttft["fcfs"]


def test_edf_with_rejection_raises_goodput_under_overload() -> None:
    from toolkit.schedulers import EDF

    lengths = synthetic_lengths(200, seed=6, prompt_median=40, output_median=30, max_prompt=128, max_total=200)
    trace = make_trace(lengths, rate=60.0, vocab_size=500, seed=6, deadline=3.0)
    cost = CostModel({"const": 0.02, "prefill_tokens": 2e-5, "decode_seqs": 2e-4})
    kw = dict(num_blocks=512, block_size=16, max_num_seqs=16, max_num_batched_tokens=512)
    fcfs = summarize(Simulator("fcfs", cost, **kw).run(trace))
    edf = summarize(Simulator(EDF(tpot=0.025, prefill_tokens_per_s=20000, on_miss="reject"), cost, **kw).run(trace))
    assert edf["rejected"] > 0 and edf["goodput_req_s"] > fcfs["goodput_req_s"]


# -- metrics --
def test_jain_and_max_min_shares() -> None:
    assert jain_index([1, 1, 1]) == 1.0 and jain_index([1, 0, 0]) == pytest.approx(1 / 3)
    assert max_min_shares({"a": 1.0, "b": 10.0, "c": 10.0}, 9.0) == {"a": 1.0, "b": 4.0, "c": 4.0}
    assert max_min_shares({"a": 1.0, "b": 2.0}, 10.0) == {"a": 1.0, "b": 2.0}


def test_summary_of_a_hand_made_run() -> None:
    reqs = {"x": RequestTiming("x", 0.0, 4, 3, token_times=[1.0, 1.5, 2.0], finish=2.0),
            "y": RequestTiming("y", 1.0, 4, 2, token_times=[4.0, 5.0], finish=5.0, deadline=3.0)}
    s = summarize(RunResult(reqs, []), ttft_slo=2.0, tpot_slo=0.6)
    assert s["ttft"]["mean"] == 2.0 and s["tpot"]["p50"] == pytest.approx(0.75)
    assert s["goodput_req_s"] == pytest.approx(1 / 5.0)       # y misses TTFT, TPOT and its deadline
    assert s["throughput_tok_s"] == pytest.approx(5 / 5.0)


def test_simulator_needs_a_cost_model() -> None:
    with pytest.raises(ValueError, match="cost="):
        Simulator("fcfs")
    assert isinstance(SchedulerOutput(), SchedulerOutput)


def test_async_output_reports_each_step_one_step_later() -> None:
    trace = Trace([TraceRequest("a", 0.0, list(range(10)), 3)])
    sync = Simulator("fcfs", const(0.5), num_blocks=64, block_size=4).run(trace).requests["a"]
    late = Simulator("fcfs", const(0.5), num_blocks=64, block_size=4, async_output=True).run(trace).requests["a"]
    assert sync.token_times == [0.5, 1.0, 1.5]
    assert late.token_times == [1.0, 1.5, 1.5]        # the last one lands in a step that runs nothing
    assert late.finish == 1.5


def test_steps_from_admission_to_first_token() -> None:
    """admitted_step / first_token_step count the steps run: a request admitted to an idle
    simulator gets its first token after 1 step, or 2 with async output; one that arrives
    while a step runs is admitted at that step's end."""
    trace = Trace([TraceRequest("a", 0.0, list(range(10)), 3), TraceRequest("b", 0.7, list(range(20, 28)), 2)])
    for async_output, after in ((False, 1), (True, 2)):
        run = Simulator("fcfs", const(0.5), num_blocks=64, block_size=4, async_output=async_output).run(trace)
        a, b = run.requests["a"], run.requests["b"]
        assert (a.admitted_step, a.first_token_step) == (0, after)
        assert b.admitted_step == 2 and b.admitted == 1.0        # step 2 ran 0.5-1.0
        assert b.first_token_step - b.admitted_step == after


def test_finish_estimate_from_a_cost_model_drives_edf_admission() -> None:
    from toolkit.schedulers import EDF
    from toolkit.types import Request, SamplingParams

    cost = CostModel({"const": 0.01, "prefill_tokens": 1e-4, "decode_seqs": 1e-3})
    est = cost.finish_estimate(batch=10, context=100, prefill_chunk=1000)
    r = Request("x", list(range(500)), SamplingParams(max_tokens=50), expected_output_len=20)
    assert est(r, 0.0) == pytest.approx(0.01 + 500 * 1e-4 + 20 * (0.01 + 10 * 1e-3))
    trace = Trace([TraceRequest("tight", 0.0, list(range(500)), 20, deadline=0.3),
                   TraceRequest("easy", 0.0, list(range(600, 1100)), 20, deadline=5.0)])
    run = Simulator(EDF(estimate=est, on_miss="reject"), const(0.02), num_blocks=128).run(trace)
    assert run.requests["tight"].finish_reason == "rejected" and run.requests["easy"].finish_reason == "length"
