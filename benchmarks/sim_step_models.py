"""Offline, on the CPU: cost models fitted to the per-step GPU times of one load's engine runs
(a `sim_gpu_all` raw JSON), with and without `mixed_ktokens`, simulate the other load's
comparisons (out of sample), against the engine's per-metric medians. --across policies: fitted
to the other policies' runs at the same load instead (a run with one load).

    python -m benchmarks sim_step_models RESULTS.json RAW.json.gz   # the two files sim_gpu_all writes

The live comparisons fit on a sweep and 32-step windows of the calibration runs; this asks
whether a different step model would have predicted the other load (decision 0008).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_gpu_all import CLIENT_SHARES, compare, fresh_prompts  # noqa: E402
from toolkit.schedulers.policies import resolve_policy  # noqa: E402
from toolkit.simulator import FEATURES, CostModel, Simulator, multi_client_trace, sharegpt_lengths  # noqa: E402
from toolkit.simulator.cost import as_features  # noqa: E402

METRICS = ("ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90", "throughput_tok_s")


def step_samples(raw: dict, load: float, policy: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features [S, len(FEATURES)] and GPU seconds [S] of every recorded engine step at `load`
    (of `policy`'s run only, when given; rows: start, period, GPU time, features, grants, ...;
    the first two steps of a run left out). Rows recorded before mixed_ktokens get it computed
    (`as_features(one_step=True)`)."""
    xs, ys = [], []
    for key, rows in raw.items():
        if not key.startswith("steps@") or float(key.rsplit("@", 1)[1]) != load:
            continue
        if policy is not None and key.split("@")[1] != policy:
            continue
        for row in rows[2:]:
            if row[2]:
                grants = next(i for i, v in enumerate(row) if isinstance(v, list))
                xs.append(as_features(row[3:grants], one_step=True))
                ys.append(float(row[2]))
    return np.array(xs), np.array(ys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="sim_gpu_all results JSON")
    ap.add_argument("raw", help="its raw JSON (.json or .json.gz)")
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--across", choices=("loads", "policies"), default="loads",
                    help="fit on the other loads' steps (default), or on the other policies' at the same load")
    args = ap.parse_args()
    res = json.load(open(args.results))["shapes"][args.shape]
    opener = gzip.open if args.raw.endswith(".gz") else open
    raw = json.load(opener(args.raw))[args.shape]
    settings = dict(res["engine"])
    final = CostModel.from_dict(res["cost"]["final"])
    loads = sorted({run["load"] for run in res["runs"]})
    linear = [f for f in FEATURES if f != "mixed_ktokens"]
    print(f"{'load':>5s} {'policy':6s} {'model':32s} " + "  ".join(f"{m:>16s}" for m in METRICS))
    for run in res["runs"]:
        if args.across == "loads":
            others = [(x, None, f"steps at {x:g}x") for x in loads if x != run["load"]]
        else:
            others = [(run["load"], p, f"{p}'s steps") for p in sorted({r["policy"] for r in res["runs"]})
                      if p != run["policy"]]
        models = {"the run's (live)": final}
        for load, policy, label in others:
            X, y = step_samples(raw, load, policy)
            for name, feats in ((f"{label}, linear", linear), (f"{label}, + mixed_ktokens", FEATURES)):
                models[name] = CostModel.fit(zip(X, y), features=feats, source=name,
                                             admission=final.admission, graph_tokens=final.graph_tokens)
        tr = run["trace"]
        lengths = sharegpt_lengths(tr["n"], seed=0)[:tr["n"]]
        base = multi_client_trace(lengths, {c: s * run["rate"] for c, s in CLIENT_SHARES.items()},
                                  vocab_size=settings["vocab_size"], seed=tr["arrivals_seed"])
        trace = fresh_prompts(base, tr["prompts_seed"], settings["vocab_size"])
        runs = run.get("engine_runs")
        real = {k: float(np.median([m[k] for m in runs])) for k in runs[0]} if runs else run["real"]
        for name, cost in models.items():
            sim = Simulator(resolve_policy(run["policy"]), cost, **settings).run(trace).summary()
            row = compare(sim, real)
            print(f"{run['load']:5.2f} {run['policy']:6s} {name:32s} "
                  + "  ".join(f"{row[m]['rel']:+16.1%}" for m in METRICS), flush=True)


if __name__ == "__main__":
    main()
