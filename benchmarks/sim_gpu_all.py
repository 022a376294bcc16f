"""The simulator against the engine, end to end in one process: calibrate, find saturation,
compare policies below and above it. For each model shape (random weights):

1. Calibrate: the step-shape sweep (sim_common.GPU_SWEEP: decodes, prefills of one and of
   several prompts, mixes) and add_request's host time (calibrate.profile_admission); a
   first cost model fitted on the sweep alone.
2. Saturation: all of a burst of requests (more than max_num_seqs) at once on the
   engine; the completion rate while it runs a full batch with a queue behind it (from
   max_num_seqs / 2 completions on, until the queue empties) is the sustainable rate mu.
   Then a short ladder of Poisson runs from 0.8 mu, x --ladder (1.5625: then 1.25 mu)
   until bracketed: a run is overloaded when its queue grows over the run (the median
   TTFT of the last quarter of arrivals over twice the first quarter's, and grown by more
   than 5% of the arrival window). Then --ladder-refine runs (default 2) halve the bracket,
   and its geometric mean is saturation (on the H200, Poisson arrivals at 1.2x a burst's
   full-batch rate were sustained); with --ladder-refine 0, saturation = mu if the coarse
   bracket holds it, else the bracket's geometric mean. The simulator's mu (its own burst)
   is printed beside it.
3. The cost model refit on the sweep plus the ladder runs' own steps (sums over windows
   of 32 steps, see TraceRecorder.window_samples; the two sources weighted alike), with the
   admission terms: saved as "<device>/<shape>" in toolkit/simulator/data/cost_models.json.
   The burst and ladder use ShareGPT entries 400.. (other prompt ids, other arrivals),
   the comparisons entries 0..
4. For each load (--loads, fractions of saturation) and policy (--policies): one trace
   (ShareGPT lengths, three clients in one Poisson process at load x saturation), fresh
   prompt ids per policy (the engine's prefix cache keeps earlier runs' blocks); the
   policy object on the simulator (the final cost model; --diagnostics: the sweep-only one
   too), then unchanged on
   the engine. Relative errors of TTFT / TPOT (mean, p90) and throughput; criteria below
   saturation TTFT and TPOT within 10%, above it throughput and mean TPOT. TTFT split in
   two: arrival -> add_request done (waiting for the step in progress, + admission) and
   -> first token.

Results go to --out after every run (a timeout keeps what was done); per-request times and
one run's step recording to --raw. A table at the end (and after each shape).

    python -m benchmarks sim_gpu_all                   # the H200: both shapes, ~7-8 min cold
    python -m benchmarks sim_gpu_all --quick           # the CPU check: a 2-layer Llama, ~2 min
    python -m benchmarks sim_gpu_all --replay benchmarks/results/sim_gpu_all.json   # CPU, afterwards
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import (  # noqa: E402
    GPU_SWEEP,
    SHAPE_NAMES,
    TINY_SWEEP,
    build_llm,
    engine_settings,
    release_llm,
)

# per shape: requests of the burst, of each ladder run, of the comparisons below and above
# saturation; ladder runs at most; the length scale (the CPU model's requests are shorter).
# Saturation needs more requests than max_num_seqs (256 on the GPU): below that the engine
# takes every arrival into its batch and no queue forms whatever the rate.
PLAN = {
    "llama8b": dict(burst_n=600, ladder_n=500, ladder_runs=3, below_n=300, above_n=400, scale=1.0),
    "qwen3": dict(burst_n=600, ladder_n=500, ladder_runs=3, below_n=300, above_n=400, scale=1.0),
    "tiny": dict(burst_n=80, ladder_n=70, ladder_runs=3, below_n=40, above_n=60, scale=0.5),
}
RESERVE_PER_SHAPE = 130.0    # seconds kept for each shape still to come (its build and sweep)
OFFSET = 400                 # the burst's and the ladder's requests: ShareGPT entries from here on
CLIENT_SHARES = {"a": 0.2, "b": 0.3, "c": 0.5}


def rel(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def queue_growth(run) -> dict:
    """Does the queue grow over the run? Median TTFT of the first and last quarter of the
    arrivals, and the arrival window; overloaded: last > 2 x first and last - first > 5% of
    the window."""
    import numpy as np

    reqs = sorted((r for r in run.requests.values() if r.ttft is not None), key=lambda r: r.arrival)
    q = max(len(reqs) // 4, 1)
    first = float(np.median([r.ttft for r in reqs[:q]]))
    last = float(np.median([r.ttft for r in reqs[-q:]]))
    window = reqs[-1].arrival - reqs[0].arrival if reqs else 0.0
    over = last > 2 * first and last - first > 0.05 * window
    return dict(ttft_p50_first=first, ttft_p50_last=last, window_s=window, overloaded=bool(over))


def burst_rate(run, max_num_seqs: int) -> dict:
    """Requests / s completed while the batch is full and a queue waits: completions from
    max_num_seqs / 2 (the first batch's short requests leave first) to n - max_num_seqs
    (after that the queue is empty and the batch shrinks); the middle half if n is small."""
    f = sorted(r.finish for r in run.requests.values() if r.finish is not None)
    n = len(f)
    i0, i1 = max_num_seqs // 2, n - max_num_seqs
    if i1 - i0 < max(10, n // 5):
        i0, i1 = n // 4, (3 * n) // 4
    return dict(rate=(i1 - i0) / max(f[i1] - f[i0], 1e-9), window=(i0, i1), makespan_s=run.makespan)


def ladder(is_over, guess: float, factor: float, max_runs: int, refine: int = 0) -> tuple[float, bool, list]:
    """Rates guess * factor^j: up while stable, down while overloaded, until the first
    change of direction brackets saturation (or max_runs); then `refine` more runs at the
    bracket's geometric mean, each halving it (in log rate). Returns the geometric mean of
    the final bracket, whether it was bracketed (if not: the highest stable rate, or the
    lowest overloaded one / factor), and the rates tried."""
    tried, rate = [], guess

    def bracket() -> tuple[float, float] | None:
        stable = [t["rate"] for t in tried if not t["overloaded"]]
        loaded = [t["rate"] for t in tried if t["overloaded"]]
        return (max(stable), min(loaded)) if stable and loaded else None

    for _ in range(max_runs):
        over, info = is_over(rate)
        tried.append(dict(rate=rate, **info))
        if bracket():
            for _ in range(refine):
                lo, hi = bracket()
                mid = math.sqrt(lo * hi)
                tried.append(dict(rate=mid, refine=True, **is_over(mid)[1]))
            lo, hi = bracket()
            return math.sqrt(lo * hi), True, tried
        rate = rate / factor if over else rate * factor
    stable = [t["rate"] for t in tried if not t["overloaded"]]
    return (max(stable) if stable else min(t["rate"] for t in tried) / factor), False, tried


def fresh_prompts(trace, seed: int, vocab: int):
    """The same arrivals, lengths and clients with new random prompt ids."""
    import dataclasses

    import numpy as np

    from toolkit.simulator import Trace

    rng = np.random.default_rng(seed)
    reqs = [dataclasses.replace(r, prompt_ids=rng.integers(0, vocab, r.prompt_len).tolist())
            for r in trace.requests]
    return Trace(reqs, trace.label, dict(trace.meta))


def split_ttft(run) -> dict:
    """Mean seconds of TTFT before the request was added (the step in progress, admission)
    and after it (steps until the first token came back)."""
    import numpy as np

    reqs = [r for r in run.requests.values() if r.ttft is not None and r.admitted is not None]
    if not reqs:
        return dict(wait_s=float("nan"), after_s=float("nan"), after_steps=float("nan"))
    steps = [r.first_token_step - r.admitted_step for r in reqs
             if r.first_token_step is not None and r.admitted_step is not None]
    return dict(wait_s=float(np.mean([r.admission_wait for r in reqs])),
                after_s=float(np.mean([r.ttft - r.admission_wait for r in reqs])),
                after_steps=float(np.mean(steps)) if steps else float("nan"))


def step_mix(run, graph_tokens: int | None) -> dict:
    """What a run's steps held on average: whether the simulator scheduled the engine's mix
    (then a gap is the cost model's) or another one (timing). eager_steps: steps of more
    tokens than the CUDA graphs hold (None without graphs)."""
    import numpy as np

    if not run.steps:
        return {}
    pre = np.array([s.prefill_tokens for s in run.steps], dtype=np.float64)
    dec = np.array([s.decode_seqs for s in run.steps], dtype=np.float64)
    return dict(steps=len(run.steps), prefill_tokens=float(pre.mean()), decode_seqs=float(dec.mean()),
                prefill_steps=float((pre > 0).mean()),
                eager_steps=None if graph_tokens is None else int((pre + dec > graph_tokens).sum()))


def _mix_line(entry: dict) -> str:
    m, w = entry["step_mix"], entry["window_residual"]
    if not m["sim"] or not m["real"]:
        return ""
    return ("           steps (sim/real): " + ", ".join(
        f"{k} {m['sim'][k]:.3g}/{m['real'][k]:.3g}" for k in ("steps", "prefill_tokens", "decode_seqs",
                                                             "prefill_steps", "eager_steps")
        if m["sim"][k] is not None)
        + (f"; the model on the engine's 32-step windows: {w['mean']:+.1%} mean, {w['median']:+.1%} median"
           if w else "")
        + (f"; engine wall {h['wall_s']:.2f} s against GPU {h['gpu_s']:.2f} s, {h['host_bound_share']:.0%} of "
           f"steps host-bound" + (f", host work {h['host_work_s']:.2f} s" if h.get("host_work_s") is not None
                                  else "") if (h := entry.get("host_vs_gpu")) else ""))


def window_residual(cost, recording, window: int = 32) -> dict:
    """The cost model against an engine run's own steps: predicted / measured - 1 over
    sliding windows of `window` steps (TraceRecorder.window_samples)."""
    import numpy as np

    w = recording.window_samples(window) if recording is not None else []
    if not w:
        return {}
    r = np.array([float(cost.predict_features(f)) / t - 1 for f, t in w])
    return dict(mean=float(r.mean()), median=float(np.median(r)), windows=len(w))


def host_vs_gpu(recording) -> dict:
    """An engine run's step-to-step wall time against its GPU time (StepRecord.gpu_time):
    sums over the run, and the share of steps whose wall exceeds their GPU time by 10% (the
    host, not the GPU, set their pace). Empty without GPU times (the CPU)."""
    steps = [s for s in (recording.steps if recording is not None else [])[2:]
             if s.gpu is not None and s.period is not None]
    if not steps:
        return {}
    wall = [s.period + (s.gap or 0.0) for s in steps]
    # the host's own work: the step() calls less their waits for the device, and the driver's gaps
    host = [w - s.wait for w, s in zip(wall, steps) if s.wait is not None]
    return dict(steps=len(steps), wall_s=float(sum(wall)), gpu_s=float(sum(s.gpu for s in steps)),
                host_bound_share=sum(w > 1.1 * s.gpu for w, s in zip(wall, steps)) / len(steps),
                host_work_s=float(sum(host)) if host else None)


def metric_values(summary: dict) -> dict:
    """The compared metrics of a RunResult summary: TTFT and TPOT mean / p90 (s), output tok/s."""
    return {"ttft_mean": summary["ttft"]["mean"], "ttft_p90": summary["ttft"]["p90"],
            "tpot_mean": summary["tpot"]["mean"], "tpot_p90": summary["tpot"]["p90"],
            "throughput_tok_s": summary["throughput_tok_s"]}


def compare(sim: dict, real: dict) -> dict:
    """Per metric: the simulator's value, the engine's (a summary, or metric_values of one)
    and the simulator's relative error."""
    a = metric_values(sim) if "ttft" in sim else sim
    b = metric_values(real) if "ttft" in real else real
    return {k: dict(sim=a[k], real=b[k], rel=rel(a[k], b[k])) for k in a}


def criteria(load: float) -> list[str]:
    return ["ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90"] if load < 1 else ["throughput_tok_s", "tpot_mean"]


def raw_times(run) -> list:
    """[arrival, admitted, first token, last token, tokens, prompt tokens, steps run at
    admission, steps run when the first token was reported] per request."""
    return [[r.arrival, r.admitted, r.token_times[0] if r.token_times else None,
             r.token_times[-1] if r.token_times else None, len(r.token_times), r.prompt_len,
             r.admitted_step, r.first_token_step]
            for r in run.requests.values()]


class Out:
    """The results JSON, rewritten after every step of the plan."""

    def __init__(self, path: str | None, raw: str | None, meta: dict) -> None:
        self.path, self.raw_path = path, raw
        self.data = dict(meta, shapes={})
        self.raw: dict = {}

    def save(self) -> None:
        for path, data, indent in ((self.path, self.data, 1), (self.raw_path, self.raw, None)):
            if path:
                tmp = path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(data, f, indent=indent, default=float)
                os.replace(tmp, path)


def run_shape(shape: str, args, out: Out, t_start: float, reserve: float = 0.0) -> None:
    import numpy as np

    from toolkit.schedulers.policies import resolve_policy
    from toolkit.simulator import (
        CostModel,
        Simulator,
        make_trace,
        multi_client_trace,
        scaled_lengths,
        sharegpt_lengths,
    )
    from toolkit.simulator.calibrate import device_key, profile_admission, profile_engine
    from toolkit.simulator.replay import run_on_engine

    plan = dict(PLAN[shape])
    if args.compare_n:
        plan["below_n"] = plan["above_n"] = args.compare_n
    res = out.data["shapes"].setdefault(shape, {})
    raw = out.raw.setdefault(shape, {})
    # what the comparisons may spend: the budget, less a reserve for the shapes still to come
    left = lambda: args.budget - reserve - (time.perf_counter() - t_start)     # noqa: E731

    # -- 1. calibrate --
    t = time.perf_counter()
    # --capture-tokens: steps up to N tokens replay CUDA graphs (EngineConfig.max_cudagraph_capture_size)
    llm = build_llm(shape, **({"max_cudagraph_capture_size": args.capture_tokens} if args.capture_tokens else {}))
    key = device_key(llm, SHAPE_NAMES[shape])
    settings = engine_settings(llm)
    vocab = settings["vocab_size"]
    res.update(key=key, build_s=time.perf_counter() - t, engine=settings)
    print(f"\n[{key}] engine built (+ warm-up) in {res['build_s']:.1f} s [at {time.perf_counter() - t_start:.0f} s]",
          flush=True)
    t = time.perf_counter()
    sweep = dict(TINY_SWEEP if shape == "tiny" else GPU_SWEEP)
    samples = profile_engine(llm, progress=True, **sweep)
    admission = profile_admission(llm, lengths=(16, 128, 512) if shape == "tiny" else (16, 256, 1024))
    graph_tokens = llm.engine.runner.graph_tokens      # larger steps run eagerly (cost.FEATURES)
    first = CostModel.fit(samples, source=f"sweep on {key.split('/')[0]}, {time.strftime('%Y-%m-%d')}",
                          admission=admission, graph_tokens=graph_tokens)
    res["sweep"] = dict(cost=first.to_dict(), seconds=time.perf_counter() - t, samples=[
        dict(features=x.tolist(), measured_s=y, fitted_s=float(first.predict_features(x))) for x, y in samples])
    print(f"[{key}] sweep fit: {first!r}\n  mean relative error {first.fit_error['mean_rel']:.1%}, "
          f"max {first.fit_error['max_rel']:.1%}; add_request {admission['per_request'] * 1e6:.0f} us "
          f"+ {admission['per_token'] * 1e6:.2f} us/token ({res['sweep']['seconds']:.0f} s)", flush=True)
    save_model(first, key, shape, args)      # replaced by the final fit below, if the run gets there
    out.save()

    def lengths(n: int, offset: int = 0):
        got = sharegpt_lengths(offset + n, seed=args.seed)[offset:offset + n]
        return scaled_lengths(got, plan["scale"], min_len=4) if plan["scale"] != 1.0 else got

    burst_lengths = lengths(plan["burst_n"], OFFSET)
    ladder_lengths = lengths(plan["ladder_n"], OFFSET)
    mns = settings["max_num_seqs"]

    # -- 2. saturation: the burst's full-batch rate, then a short ladder of Poisson runs --
    def sim_mu(cost) -> float:
        burst = make_trace(burst_lengths, rate=1e9, vocab_size=vocab, seed=args.seed + 7)
        return burst_rate(Simulator("fcfs", cost, **settings).run(burst), mns)["rate"]

    recordings = []
    llm.engine.scheduler.set_policy(resolve_policy("fcfs"))
    t = time.perf_counter()
    burst = make_trace(burst_lengths, rate=1e9, vocab_size=vocab, seed=args.seed + 900)
    real_burst = run_on_engine(llm, burst, realtime=False, label="burst", time_limit=args.run_limit)
    recordings.append(real_burst.recording)
    mu = burst_rate(real_burst, mns)
    sim_mu0 = sim_mu(first) if args.diagnostics else float("nan")
    print(f"[{key}] burst of {len(burst)}: engine {mu['rate']:.2f} req/s at a full batch"
          + (f" (simulator, sweep model: {sim_mu0:.2f}, {rel(sim_mu0, mu['rate']):+.0%})" if args.diagnostics else "")
          + f"; {mu['makespan_s']:.1f} s", flush=True)

    def engine_over(rate):
        trace = make_trace(ladder_lengths, rate=rate, vocab_size=vocab, seed=args.seed + 1000 + len(recordings))
        try:
            run = run_on_engine(llm, trace, label=f"ladder {rate:.2f}", time_limit=args.run_limit)
        except TimeoutError:
            print(f"  engine at {rate:7.2f} req/s: not done in {args.run_limit:.0f} s -> overloaded", flush=True)
            return True, dict(overloaded=True, timed_out=True)
        recordings.append(run.recording)
        g = queue_growth(run)
        g.update(throughput_req_s=run.summary()["throughput_req_s"], makespan_s=run.makespan)
        print(f"  engine at {rate:7.2f} req/s: TTFT p50 first/last quarter {g['ttft_p50_first'] * 1e3:7.1f} / "
              f"{g['ttft_p50_last'] * 1e3:7.1f} ms over {g['window_s']:.1f} s of arrivals -> "
              f"{'overloaded' if g['overloaded'] else 'stable'}", flush=True)
        return g["overloaded"], g

    # the ladder's runs take about n / rate + a request's life each; skip it if it would eat the
    # comparisons' time (saturation is then the burst's rate)
    need = ((2 + args.ladder_refine) * plan["ladder_n"] / mu["rate"]) + 2 * mu["makespan_s"] / 3
    runs = plan["ladder_runs"] if left() > need + 60 and not args.saturation else 0
    if not runs and not args.saturation:
        print(f"  ladder skipped: {left():.0f} s of the budget left, ~{need:.0f} s needed", flush=True)
    sat, bracketed, tried = (ladder(engine_over, 0.8 * mu["rate"], args.ladder, runs, args.ladder_refine)
                             if runs else (mu["rate"], False, []))
    stable = [x["rate"] for x in tried if not x["overloaded"]] or [0.0]
    loaded = [x["rate"] for x in tried if x["overloaded"]] or [math.inf]
    if not bracketed or (not args.ladder_refine and max(stable) <= mu["rate"] <= min(loaded)):
        sat = mu["rate"]           # the burst's rate, when the ladder agrees (or says nothing)
    if args.saturation:            # given (an earlier run's): no ladder
        sat = args.saturation
    res["saturation"] = dict(engine_req_s=sat, bracketed=bracketed, burst=mu, engine_ladder=tried,
                             sim_sweep_model_burst_req_s=sim_mu0, seconds=time.perf_counter() - t)
    print(f"[{key}] saturation {sat:.2f} req/s" + (" (given)" if args.saturation else "" if bracketed
                                                   else " (the ladder did not bracket it: the burst's)")
          + (" (the burst's rate, inside the ladder's bracket)" if bracketed and sat == mu["rate"] else "")
          + f" ({res['saturation']['seconds']:.0f} s) [at {time.perf_counter() - t_start:.0f} s]", flush=True)
    out.save()

    # -- 3. the final fit: sweep + the ladder runs' steps --
    windows = [w for rec in recordings if rec is not None for w in rec.window_samples(window=32, skip=4)]
    both = list(samples) + windows
    weights = [1.0 / len(samples)] * len(samples) + [1.0 / max(len(windows), 1)] * len(windows)
    res["windows"] = [dict(features=x.tolist(), measured_s=y) for x, y in windows]   # offline refits
    cost = CostModel.fit(both, weights=weights, admission=admission, graph_tokens=graph_tokens,
                         source=f"benchmarks/sim_gpu_all.py on {key.split('/')[0]}, {time.strftime('%Y-%m-%d')}: "
                                f"{len(samples)} step shapes + {len(windows)} 32-step windows of "
                                f"{len(recordings)} engine runs (the burst, the ladder)")
    save_model(cost, key, shape, args)
    sweep_err = np.abs(cost.predict_features(np.stack([x for x, _ in samples])) - np.array([y for _, y in samples]))
    sweep_err = float(np.mean(sweep_err / np.array([y for _, y in samples])))
    res["cost"] = dict(final=cost.to_dict(), final_sweep_mean_rel=sweep_err, windows=len(windows))
    print(f"[{key}] final fit: {cost!r}\n  mean relative error {cost.fit_error['mean_rel']:.1%} "
          f"(on the sweep alone {sweep_err:.1%})", flush=True)
    out.save()
    sim_mu1 = sim_mu(cost)
    res["saturation"]["sim_final_model_burst_req_s"] = sim_mu1
    print(f"[{key}] simulator (final model): burst {sim_mu1:.2f} req/s at a full batch "
          f"({rel(sim_mu1, mu['rate']):+.0%} against the engine's)", flush=True)

    # -- 4. the policies, simulated and on the engine --
    res["runs"] = []
    loads = [float(x) for x in args.loads.split(",")]
    policies = args.policies.split(",")
    for i, load in enumerate(loads):
        rate = load * sat
        base = multi_client_trace(lengths(plan["below_n"] if load < 1 else plan["above_n"]), {c: s * rate for c, s in CLIENT_SHARES.items()},
                                  vocab_size=vocab, seed=args.seed + 1 + 100 * i)
        for j, name in enumerate(policies):
            expect = expected_run_s(len(base), rate, load)
            if left() < expect:
                print(f"  skipped {name} at {load:g}x: {left():.0f} s of the budget left, "
                      f"~{expect:.0f} s needed", flush=True)
                res.setdefault("skipped", []).append(dict(load=load, policy=name))
                continue
            trace_seeds = dict(n=len(base), arrivals_seed=args.seed + 1 + 100 * i, prompts_seed=args.seed + 10_000 + 100 * i + j)
            trace = fresh_prompts(base, trace_seeds["prompts_seed"], vocab)
            policy = resolve_policy(name)
            t = time.perf_counter()
            sim = Simulator(policy, cost, **settings).run(trace, label=f"sim {name} {load:g}x")
            sim_s = time.perf_counter() - t
            # --diagnostics: the sweep-only model too, for the first policy (what the live
            # windows changed; also computable afterwards from the JSON: same seeds, same traces)
            sim0 = Simulator(resolve_policy(name), first, **settings).run(trace, label=f"sim(sweep) {name} {load:g}x") \
                if j == 0 and args.diagnostics else None
            llm.engine.scheduler.set_policy(policy)
            try:
                real = run_on_engine(llm, trace, label=f"engine {name} {load:g}x", time_limit=args.run_limit)
            except TimeoutError as e:
                print(f"  {name} at {load:g}x: {e}", flush=True)
                res.setdefault("skipped", []).append(dict(load=load, policy=name, error=str(e)))
                continue
            s, r = sim.summary(), real.summary()
            # --engine-runs K: K - 1 more engine runs on the same arrivals (other prompt tokens);
            # the criteria then hold the simulator to the runs' per-metric median, and the
            # engine's own spread around it is recorded (the 10% bar means nothing below it)
            metrics, hosts = [metric_values(r)], [dict(real.host_time)]
            for extra in range(1, args.engine_runs):
                if left() < expect:
                    break
                again = run_on_engine(llm, fresh_prompts(base, trace_seeds["prompts_seed"] + 50_000 * extra, vocab),
                                      label=f"engine {name} {load:g}x run {extra + 1}", time_limit=args.run_limit)
                metrics.append(metric_values(again.summary()))
                hosts.append(dict(again.host_time))
            med = {k: float(np.median([m[k] for m in metrics])) for k in metrics[0]}
            r_cmp = med if len(metrics) > 1 else r
            s0 = sim0.summary() if sim0 is not None else None
            row, row0 = compare(s, r_cmp), compare(s0, r_cmp) if s0 is not None else None
            keys = criteria(load)
            ok = all(abs(row[k]["rel"]) <= 0.10 for k in keys)
            host = dict(real.host_time)
            entry = dict(load=load, policy=name, rate=rate, trace=trace_seeds, sim=s, sim_sweep=s0, real=r, compare=row,
                         compare_sweep_model=row0, criteria=keys, within_10pct=ok, sim_wall_s=sim_s,
                         ttft_split=dict(sim=split_ttft(sim), real=split_ttft(real)),
                         step_mix=dict(sim=step_mix(sim, graph_tokens), real=step_mix(real, graph_tokens)),
                         window_residual=window_residual(cost, real.recording),
                         host_vs_gpu=host_vs_gpu(real.recording),
                         queue=dict(sim=queue_growth(sim), real=queue_growth(real)),
                         jain=dict(sim=s["jain_fairness"], real=r["jain_fairness"]), engine_host=host)
            # each run's Triton compiles and longest step: a run whose queue a compile stalled
            entry["engine_run_hosts"] = [dict(compiles=h.get("compiles", {}), longest_step_s=h.get("longest_step_s"),
                                              gc_longest_s=h.get("gc_longest_s")) for h in hosts]
            print(f"  {name:8s} {load:4.2f}x engine runs: " + "; ".join(
                f"compiles {sum(c[0] for c in h['compiles'].values())} ({sum(c[1] for c in h['compiles'].values()):.2f} s"
                f"{': ' + ', '.join(sorted(h['compiles'])) if h['compiles'] else ''}), longest step "
                f"{(h['longest_step_s'] or 0) * 1e3:.0f} ms" for h in entry["engine_run_hosts"]), flush=True)
            if len(metrics) > 1:
                entry["engine_runs"] = metrics
                entry["engine_spread"] = {k: [min(m[k] for m in metrics) / med[k] - 1,
                                              max(m[k] for m in metrics) / med[k] - 1] for k in med}
                print(f"  {name:8s} {load:4.2f}x the engine's {len(metrics)} runs around their median: "
                      + ", ".join(f"{k} {lo:+.0%}..{hi:+.0%}" for k, (lo, hi) in entry["engine_spread"].items()),
                      flush=True)
            res["runs"].append(entry)
            raw[f"{name}@{load:g}"] = dict(sim=raw_times(sim), real=raw_times(real))
            if j == 0 and i == 0:
                rec = real.recording
                raw["steps_first_run"] = [s.features.tolist() + [s.period] for s in rec.steps]
            # every comparison's engine steps: start, period, GPU time, features, then the
            # scheduled requests in batch order (ids numbered by first appearance) with their
            # tokens, to tell a policy's slower steps apart offline; then running and waiting
            # after the step and the host's wait for its tokens (period - wait: host work)
            ids: dict[str, int] = {}
            raw[f"steps@{name}@{load:g}"] = [
                [st.time - real.recording.steps[0].time, st.period, st.gpu, *st.features.tolist(),
                 [[ids.setdefault(rid, len(ids)), n] for rid, n in st.grants.items()],
                 st.log.num_running, st.log.num_waiting, st.wait]
                for st in real.recording.steps]
            if j == 0 and load > 1 and args.plot_dir:
                from toolkit.simulator.plots import plot_over_time

                png = os.path.join(args.plot_dir, f"sim_gpu_all_ttft_{shape}.png")
                plot_over_time([sim, real], "ttft").savefig(png, dpi=110)
                entry["plot"] = png
            out.save()
            sp = entry["ttft_split"]
            print(f"  {name:8s} {load:4.2f}x ({rate:6.2f} req/s): " + ", ".join(f"{k} {row[k]['rel']:+.1%}" for k in row)
                  + f" -> {'OK' if ok else 'OFF'} on {keys}\n"
                  + (("           sweep-only model: " + ", ".join(f"{k} {row0[k]['rel']:+.1%}" for k in row0) + "\n")
                     if row0 else "")
                  + f"           TTFT = wait {sp['sim']['wait_s'] * 1e3:.1f}/{sp['real']['wait_s'] * 1e3:.1f} + "
                  f"rest {sp['sim']['after_s'] * 1e3:.1f}/{sp['real']['after_s'] * 1e3:.1f} ms in "
                  f"{sp['sim']['after_steps']:.2f}/{sp['real']['after_steps']:.2f} steps (sim/real); "
                  f"jain {s['jain_fairness']:.3f}/{r['jain_fairness']:.3f}; engine in step() "
                  f"{host['step_s']:.1f} s, add_request {host['add_s'] * 1e3:.0f} ms of {real.makespan:.1f} s, "
                  f"{host.get('gc_full_passes', 0)} full GC passes ({host.get('gc_s', 0) * 1e3:.0f} ms in all GC)"
                  + (", CUDA allocator: {num_device_alloc} mallocs, {num_device_free} frees, "
                     "{num_alloc_retries} retries".format(**host["cuda_allocator"]) if "cuda_allocator" in host else "")
                  + " "
                  f"[at {time.perf_counter() - t_start:.0f} s]\n"
                  + _mix_line(entry), flush=True)
        if args.balanced:
            balance_order(llm, res, load, base, vocab, left, args)
            out.save()
    release_llm(llm)            # the KV cache and weights, before the next shape's engine
    print_table({shape: res})


def expected_run_s(n: int, rate: float, load: float) -> float:
    """Seconds a comparison's engine run, its tail and its simulation take: the arrivals at
    `rate`, or above saturation (rate / load) the engine's completion rate, plus slack."""
    return 1.4 * n / (rate if load < 1 else rate / load) + 8


def balance_order(llm, res: dict, load: float, base, vocab: int, left, args) -> None:
    """--balanced: one more engine run of each of this load's policies, in the reverse order
    (A B ... then ... B A), so each policy's runs sit at mirrored positions in the process; the
    simulator is then held to the median of each policy's runs. (The engine's later runs in a
    process were the slower ones whatever the policy: RESULTS, simulator update (i).)"""
    import numpy as np

    from toolkit.schedulers import resolve_policy
    from toolkit.simulator.replay import run_on_engine

    entries = [e for e in res["runs"] if e["load"] == load]
    for e in reversed(entries):
        expect = expected_run_s(len(base), e["rate"], load)
        if left() < expect:
            print(f"  balanced order: {e['policy']} at {load:g}x skipped ({left():.0f} s left)", flush=True)
            continue
        llm.engine.scheduler.set_policy(resolve_policy(e["policy"]))
        try:
            again = run_on_engine(llm, fresh_prompts(base, e["trace"]["prompts_seed"] + 77_777, vocab),
                                  label=f"engine {e['policy']} {load:g}x (mirrored)", time_limit=args.run_limit)
        except TimeoutError as err:
            print(f"  balanced order: {e['policy']} at {load:g}x: {err}", flush=True)
            continue
        runs = e.get("engine_runs") or [metric_values(e["real"])]
        runs.append(metric_values(again.summary()))
        med = {k: float(np.median([m[k] for m in runs])) for k in runs[0]}
        e["engine_runs"], e["balanced"] = runs, True
        e["compare"] = row = compare(e["sim"], med)
        e["within_10pct"] = all(abs(row[k]["rel"]) <= 0.10 for k in e["criteria"])
        print(f"  {e['policy']:8s} {load:4.2f}x mirrored run: TTFT mean "
              + " / ".join(f"{m['ttft_mean'] * 1e3:.1f}" for m in runs) + " ms, TPOT mean "
              + " / ".join(f"{m['tpot_mean'] * 1e3:.2f}" for m in runs) + " ms (runs in order); against "
              f"their median: " + ", ".join(f"{k} {row[k]['rel']:+.1%}" for k in row)
              + f" -> {'OK' if e['within_10pct'] else 'OFF'}", flush=True)


def save_model(cost, key: str, shape: str, args) -> None:
    """Into --data, else the shipped file (not for the CPU check, nor with --no-save)."""
    if args.data:
        cost.save(key, args.data)
    elif not args.no_save and shape != "tiny":
        cost.save(key)


def _throughput_guess(cost, lengths, settings) -> float:
    """Requests / s a full batch would sustain by the cost model: each request's prompt as
    prefill plus its output tokens as shares of a max_num_seqs decode step."""
    import numpy as np

    c, b = cost.coef, settings["max_num_seqs"]
    p = float(np.mean([x for x, _ in lengths]))
    o = float(np.mean([y for _, y in lengths]))
    step = c["const"] + b * (c["decode_seqs"] + (p + o / 2) * c["decode_kv_tokens"])
    per_req = p * c["prefill_tokens"] + c.get("prefill_seqs", 0.0) + o * step / b + cost.admission_time(int(p))
    return 1.0 / max(per_req, 1e-9)


def print_table(shapes: dict) -> None:
    cols = ["ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "throughput_tok_s"]
    print("\nshape     load  policy   " + "  ".join(f"{c:>22s}" for c in cols) + "   (sim/real ms or tok/s, rel)")
    for shape, res in shapes.items():
        for run in res.get("runs", []):
            cells = []
            for k in cols:
                c = run["compare"][k]
                f = 1 if k.startswith("throughput") else 1e3
                cells.append(f"{c['sim'] * f:7.1f}/{c['real'] * f:7.1f} {c['rel']:+5.0%}")
            print(f"{shape:9s} {run['load']:4.2f}  {run['policy']:8s} " + "  ".join(f"{x:>22s}" for x in cells)
                  + ("  OK" if run["within_10pct"] else "  OFF"))
        sat = res.get("saturation", {})
        if sat:
            print(f"{shape:9s} saturation {sat['engine_req_s']:.2f} req/s"
                  + ("" if sat["bracketed"] else " (not bracketed)")
                  + f"; full-batch rate of a burst: engine {sat['burst']['rate']:.2f}, simulator "
                  f"{sat.get('sim_final_model_burst_req_s', float('nan')):.2f} (final model), "
                  f"{sat['sim_sweep_model_burst_req_s']:.2f} (sweep model, --diagnostics)")


def eager_refit(samples: list[dict], settings: dict, admission: dict):
    """The sweep's samples refit with cost.FEATURES' eager_steps, counted from each shape's
    tokens (prefill + decodes, no drafts in the sweep) against the engine's largest CUDA-graph
    step (`EngineConfig.graph_tokens` of the run's settings, as they were then)."""
    from toolkit.config import EngineConfig
    from toolkit.simulator import FEATURES, CostModel
    from toolkit.simulator.cost import as_features, mixed_ktokens

    # those runs predate the 512-token default too: their graphs stopped at the decode batch
    graph = EngineConfig(max_num_seqs=settings["max_num_seqs"],
                         max_num_batched_tokens=settings["max_num_batched_tokens"],
                         max_cudagraph_capture_size=settings["max_num_seqs"]).graph_tokens
    i, p, d = FEATURES.index("eager_steps"), FEATURES.index("prefill_tokens"), FEATURES.index("decode_seqs")
    m = FEATURES.index("mixed_ktokens")
    xs = []
    for s in samples:                       # one shape's identical steps each: per-step features
        x = as_features(s["features"], one_step=True).copy()
        x[i] = float(x[p] + x[d] > graph)
        x[m] = mixed_ktokens(x[p], x[d], x[i])
        xs.append((x, s["measured_s"]))
    return CostModel.fit(xs, admission=admission, graph_tokens=graph, source="sweep refit with eager steps")


def replay(path: str, quick: bool, ship: str | None = None) -> None:
    """On the CPU, after a GPU run: each comparison's trace rebuilt from its seeds and
    simulated again with variants of the run's cost models (final; final without the
    admission terms; the sweep alone; the sweep refit with eager steps counted, for runs
    recorded before that feature; with ship, also the model shipped in toolkit/simulator/data,
    or in the file ship names), against the engine's recorded numbers (the per-metric median
    of its runs where there were several, as the live comparison)."""
    import numpy as np

    from toolkit.schedulers.policies import resolve_policy
    from toolkit.simulator import (
        CostModel,
        Simulator,
        make_trace,
        multi_client_trace,
        scaled_lengths,
        sharegpt_lengths,
    )

    data = json.load(open(path))
    cols = ["ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "throughput_tok_s"]
    print("shape     load  policy   model          " + "  ".join(f"{c:>16s}" for c in cols))
    for shape, res in data["shapes"].items():
        if "cost" not in res:
            continue
        settings = dict(res["engine"])
        final = CostModel.from_dict(res["cost"]["final"])
        models = {"final": final, "no admission": dataclasses.replace(final, admission={}, source="no admission"),
                  "sweep only": CostModel.from_dict(res["sweep"]["cost"])}
        if final.graph_tokens is None:      # recorded before eager_steps: count them from the shapes
            models["sweep + eager steps"] = eager_refit(res["sweep"]["samples"], settings, final.admission)
        if ship is not None:                 # the shipped model (toolkit/simulator/data, or ship's file)
            where = (ship,) if ship else ()
            if res.get("key") in CostModel.available(*where):
                models["shipped"] = CostModel.load(res["key"], *where)
        scale = PLAN["tiny" if quick else shape]["scale"]
        for run in res.get("runs", []):
            tr = run["trace"]
            got = sharegpt_lengths(tr["n"], seed=0)[:tr["n"]]
            got = scaled_lengths(got, scale, min_len=4) if scale != 1.0 else got
            base = multi_client_trace(got, {c: s * run["rate"] for c, s in CLIENT_SHARES.items()},
                                      vocab_size=settings["vocab_size"], seed=tr["arrivals_seed"])
            trace = fresh_prompts(base, tr["prompts_seed"], settings["vocab_size"])
            # the live run's reference: the per-metric median of its engine runs (--engine-runs K)
            runs = run.get("engine_runs")
            real = ({k: float(np.median([m[k] for m in runs])) for k in runs[0]} if runs else run["real"])
            for name, cost in models.items():
                sim = Simulator(resolve_policy(run["policy"]), cost, **settings).run(trace).summary()
                row = compare(sim, real)
                print(f"{shape:9s} {run['load']:4.2f}  {run['policy']:8s} {name:14s} "
                      + "  ".join(f"{row[c]['rel']:+16.1%}" for c in cols), flush=True)
        burst = res.get("saturation", {}).get("burst")
        if burst:      # the full-batch regime: the simulator's burst (as sim_mu runs it) against the engine's
            n, mns = PLAN["tiny" if quick else shape]["burst_n"], settings["max_num_seqs"]
            got = sharegpt_lengths(OFFSET + n, seed=0)[OFFSET:OFFSET + n]
            got = scaled_lengths(got, scale, min_len=4) if scale != 1.0 else got
            trace = make_trace(got, rate=1e9, vocab_size=settings["vocab_size"], seed=7)
            for name, cost in models.items():
                mu = burst_rate(Simulator("fcfs", cost, **settings).run(trace), mns)["rate"]
                print(f"{shape:9s} burst of {n}, full-batch rate: {name:20s} {mu:6.2f} req/s against the "
                      f"engine's {burst['rate']:.2f} ({rel(mu, burst['rate']):+.1%})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama8b,qwen3", help="comma list of llama8b, qwen3")
    ap.add_argument("--quick", action="store_true", help="the 2-layer CPU stand-in (a check of the script)")
    ap.add_argument("--loads", default="0.5,1.5", help="arrival rates of the comparisons, x saturation")
    ap.add_argument("--policies", default="fcfs,sjf,vtc", help="policy names (toolkit.schedulers.POLICIES)")
    ap.add_argument("--compare-n", type=int, default=0, help="requests per comparison run (0: the plan's)")
    ap.add_argument("--ladder", type=float, default=1.5625, help="factor between the ladder's rates (from 0.8 mu)")
    ap.add_argument("--budget", type=float, default=530.0, help="seconds: comparisons that would not fit are skipped")
    ap.add_argument("--ladder-refine", type=int, default=2,
                    help="after bracketing, this many Poisson runs halving the bracket; saturation is then "
                         "the refined bracket's geometric mean, not the burst's rate (Poisson arrivals at 1.2x "
                         "a burst's full-batch rate were sustained: RESULTS, simulator update 2026-12-02 (c)); "
                         "0: the burst's rate when the coarse bracket holds it, as before")
    ap.add_argument("--saturation", type=float, default=0.0,
                    help="req/s taken as saturation instead of the ladder's (an earlier run's; saves its minute)")
    ap.add_argument("--capture-tokens", type=int, default=0,
                    help="the engine's max_cudagraph_capture_size (0: its default, max_num_batched_tokens since "
                         "2026-12-02 (p); the cost models stored before were fitted with graphs to 512): "
                         "steps past it run eagerly, one host launch per kernel, at the host's pace")
    ap.add_argument("--run-limit", type=float, default=90.0, help="seconds one engine run may take")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-runs", type=int, default=1,
                    help="engine runs per comparison (other prompt tokens, the same arrivals): with K > 1 "
                         "the simulator is held to the runs' per-metric median and their spread is reported")
    ap.add_argument("--balanced", action="store_true",
                    help="after each load's policies, one more engine run of each in the reverse order; the "
                         "simulator is held to each policy's median (the engine's later runs were slower)")
    ap.add_argument("--diagnostics", action="store_true",
                    help="also simulate with the sweep-only model (the burst, each load's first policy): ~4 more "
                         "simulations a shape")
    ap.add_argument("--no-save", action="store_true", help="do not write the fitted models to the shipped data")
    ap.add_argument("--data", default=None, help="write fitted models here instead (--quick: only here)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/sim_gpu_all.json; "
                                                "--quick: /tmp/sim_gpu_all_quick.json)")
    ap.add_argument("--raw", default=None, help="per-request times JSON (default: $OUT/sim_gpu_all_raw.json, "
                                                "else <out>_raw.json)")
    ap.add_argument("--plot-dir", default=None, help="PNGs of TTFT over time, overloaded runs (default: $OUT, "
                                                     "else --out's folder)")
    ap.add_argument("--replay-shipped", nargs="?", const="", default=None, metavar="COST_MODELS_JSON",
                    help="with --replay: also simulate with the shipped cost model (or this file's)")
    ap.add_argument("--replay", default=None, metavar="RESULTS_JSON",
                    help="no engine: simulate a finished run's comparisons again with variants of its cost models")
    args = ap.parse_args()
    if args.replay:
        replay(args.replay, args.quick, args.replay_shipped)
        return
    shapes = ["tiny"] if args.quick else args.shapes.split(",")
    bad = [s for s in shapes if s not in PLAN or s == "tiny" and not args.quick]
    if bad:
        raise SystemExit(f"unknown shape(s) {bad}; valid: llama8b, qwen3 (or --quick)")
    here = os.path.dirname(os.path.abspath(__file__))
    # the CPU check's numbers say nothing about accuracy (a shared 2-core CPU): not results
    args.out = args.out or ("/tmp/sim_gpu_all_quick.json" if args.quick else os.path.join(here, "results", "sim_gpu_all.json"))
    # through `python -m benchmarks`, --out is a temporary file: the side files go to $OUT
    side = os.environ.get("OUT")
    args.raw = args.raw or (os.path.join(side, "sim_gpu_all_raw.json") if side
                            else args.out.replace(".json", "_raw.json"))
    args.plot_dir = args.plot_dir or (None if args.quick else side or os.path.dirname(os.path.abspath(args.out)))
    t_start = time.perf_counter()
    out = Out(args.out, args.raw, dict(date=time.strftime("%Y-%m-%d %H:%M"), argv=sys.argv[1:],
                                       loads=args.loads, policies=args.policies))
    for i, shape in enumerate(shapes):
        if args.budget - (time.perf_counter() - t_start) < 60:
            print(f"skipped {shape}: the budget is spent", flush=True)
            continue
        run_shape(shape, args, out, t_start, reserve=RESERVE_PER_SHAPE * (len(shapes) - 1 - i))
    out.data["total_s"] = time.perf_counter() - t_start
    out.save()
    print_table(out.data["shapes"])
    print(f"\ntotal {out.data['total_s']:.0f} s; wrote {args.out} and {args.raw}")


if __name__ == "__main__":
    main()
