"""Does the simulator's prediction hold? The same policy objects on the simulator and on the
real engine, over the same ShareGPT trace with Poisson arrivals below and above saturation.

Superseded on the GPU by benchmarks/sim_gpu_all.py (calibration, a saturation that holds, the
refit on live runs and the comparisons in one call): the requests / makespan of an
all-at-once batch below underestimates the sustainable rate (the first H200 run's "1.2x"
was not overloaded).

1. Saturation: the trace's requests all at once on the engine; saturation rate = requests /
   makespan (the simulator's own estimate printed beside it).
2. For each load (default 0.5x and 1.2x saturation) and each policy (default fcfs, sjf): a
   Poisson trace at load x saturation; the policy object runs on the simulator (cost model
   from benchmarks/sim_calibrate.py, the engine's own scheduler settings), then, unchanged,
   on the engine (`scheduler.set_policy(obj)`), with arrivals in real time.
3. A table of mean / p90 TTFT and TPOT and throughput, simulated against real, with the
   relative difference; the issue's criteria: below saturation TTFT and TPOT (mean, p90)
   within 10%; above it throughput and mean TPOT within 10%. The TTFT curve over time of
   the overloaded runs is drawn side by side (--plot). A diagnostic row: the simulator with
   the cost model refit on that engine run's own steps (calibration error vs model error).

    python -m benchmarks.sharegpt_prep --num 1000 --out benchmarks/data/sharegpt.json   # on the CPU
    python -m benchmarks simulator --num 300 \
        --plot benchmarks/results/sim_validate_ttft.png
    python -m benchmarks simulator --tiny --num 40     # the CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import SHAPE_NAMES, build_llm, engine_settings  # noqa: E402


def rel(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def compare(sim: dict, real: dict) -> dict:
    pick = {"ttft_mean": ("ttft", "mean"), "ttft_p90": ("ttft", "p90"), "tpot_mean": ("tpot", "mean"),
            "tpot_p90": ("tpot", "p90")}
    row = {}
    for name, (m, k) in pick.items():
        row[name] = dict(sim=sim[m][k], real=real[m][k], rel=rel(sim[m][k], real[m][k]))
    row["throughput_tok_s"] = dict(sim=sim["throughput_tok_s"], real=real["throughput_tok_s"],
                                   rel=rel(sim["throughput_tok_s"], real["throughput_tok_s"]))
    return row


def verdict(load: float, row: dict, tol: float = 0.10) -> tuple[bool, list[str]]:
    keys = ["ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90"] if load < 1 else ["throughput_tok_s", "tpot_mean"]
    return all(abs(row[k]["rel"]) <= tol for k in keys), keys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama8b", choices=["llama8b", "qwen3"])
    ap.add_argument("--tiny", action="store_true", help="the 2-layer CPU stand-in (a check of the script)")
    ap.add_argument("--num", type=int, default=300, help="requests per run")
    ap.add_argument("--loads", default="0.5,1.2", help="arrival rates as fractions of saturation")
    ap.add_argument("--policies", default="fcfs,sjf", help="policy names (toolkit.schedulers.POLICIES)")
    ap.add_argument("--cost-key", default=None, help="cost model key (default: <device>/<shape>)")
    ap.add_argument("--data", default=None, help="ShareGPT requests JSON (benchmarks/sharegpt_prep.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-limit", type=float, default=150.0, help="seconds one engine run may take")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, help="PNG of the TTFT curves over time (overloaded runs)")
    args = ap.parse_args()

    from toolkit.schedulers.policies import resolve_policy
    from toolkit.simulator import (
        CostModel,
        Simulator,
        make_trace,
        scaled_lengths,
        sharegpt_lengths,
        table,
    )
    from toolkit.simulator.calibrate import device_key
    from toolkit.simulator.replay import run_on_engine

    shape = "tiny" if args.tiny else args.shape
    llm = build_llm(shape)
    key = args.cost_key or device_key(llm, SHAPE_NAMES[shape])
    cost = CostModel.load(key)
    settings = engine_settings(llm)
    lengths = sharegpt_lengths(args.num, seed=args.seed, path=args.data)
    if args.tiny:                            # a 2-layer CPU model: short requests keep the check quick
        lengths = scaled_lengths(lengths, 0.2, min_len=4)
    vocab = settings["vocab_size"]
    print(f"{key}: {cost!r}\nrequests: {lengths.label}", flush=True)

    # 1. saturation: everything at once
    burst = make_trace(lengths, rate=1e9, vocab_size=vocab, seed=args.seed)
    real_sat = run_on_engine(llm, burst, realtime=False, label="engine burst", time_limit=args.run_limit)
    sat = len(burst) / real_sat.makespan
    sim_sat = len(burst) / Simulator("fcfs", cost, **settings).run(burst).makespan
    print(f"saturation: engine {sat:.2f} req/s, simulator {sim_sat:.2f} req/s ({rel(sim_sat, sat):+.1%})", flush=True)

    results = dict(key=key, cost=cost.to_dict(), lengths=lengths.label, num=args.num,
                   saturation_req_s=dict(engine=sat, sim=sim_sat), runs=[])
    over: list = []
    for i, load in enumerate(float(x) for x in args.loads.split(",")):
        for j, name in enumerate(args.policies.split(",")):
            # fresh prompt ids per run: the engine's prefix cache keeps earlier runs' blocks,
            # the simulator starts empty, so a repeated prompt would be a hit on one side only
            trace = make_trace(lengths, rate=load * sat, vocab_size=vocab, seed=args.seed + 1 + 100 * i + j)
            policy = resolve_policy(name)                  # one object: simulator, then engine
            t = time.perf_counter()
            sim = Simulator(policy, cost, **settings).run(trace, label=f"sim {name} {load:g}x")
            sim_s = time.perf_counter() - t
            llm.engine.scheduler.set_policy(policy)
            real = run_on_engine(llm, trace, label=f"engine {name} {load:g}x", time_limit=args.run_limit)
            s, r = sim.summary(), real.summary()
            row = compare(s, r)
            ok, keys = verdict(load, row)
            # diagnostic: the cost model refit on this very run's steps; if this one agrees and
            # the calibrated one does not, the calibration sweep (not the simulator) is off
            refit = real.recording.fit_cost()
            again = Simulator(policy, refit, **settings).run(trace, label=f"sim(refit) {name} {load:g}x").summary()
            results["runs"].append(dict(load=load, policy=name, rate=load * sat, sim=s, real=r, compare=row,
                                        criteria=keys, within_10pct=ok, sim_wall_s=sim_s,
                                        refit=refit.to_dict(), compare_refit=compare(again, r)))
            print(table([s, again, r]), flush=True)
            print("  " + ", ".join(f"{k} {row[k]['rel']:+.1%}" for k in row)
                  + f"  -> {'OK' if ok else 'OFF'} on {keys} (simulated in {sim_s:.2f} s)", flush=True)
            print("  refit on this run: " + ", ".join(f"{k} {v['rel']:+.1%}" for k, v in compare(again, r).items()),
                  flush=True)
            if load > 1:
                over += [sim, real]

    print("\nload  policy   " + "  ".join(f"{k:>20s}" for k in results["runs"][0]["compare"]))
    for run in results["runs"]:
        cells = [f"{c['sim'] * (1e3 if 'throughput' not in k else 1):8.1f}/{c['real'] * (1e3 if 'throughput' not in k else 1):8.1f} {c['rel']:+5.0%}"
                 for k, c in run["compare"].items()]
        print(f"{run['load']:4.1f}  {run['policy']:8s} " + "  ".join(f"{x:>20s}" for x in cells)
              + ("  OK" if run["within_10pct"] else "  OFF"))
    print("(sim/real: TTFT and TPOT in ms, throughput in output tokens/s; OK = the criteria within 10%)")
    if args.plot and over:
        from toolkit.simulator.plots import plot_over_time

        plot_over_time(over, "ttft").savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")
    llm.close()


if __name__ == "__main__":
    main()
