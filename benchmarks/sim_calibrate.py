"""Fit the simulator's cost model on the real engine: sweep step shapes, fit, write the data.

For each model shape (random weights): decode steps at batch B and context L, prefill steps
of P tokens, and mixes (B decodes + a P-token prompt), each timed as the mean wall time of
engine.step() in a run of identical steps (toolkit/simulator/calibrate.py); then a
non-negative least-squares fit on relative error of

    t = c_const + c_prefill * prefill_tokens + c_decode * decode_seqs
        + c_decode_kv * decode_kv_tokens + c_prefill_attn * prefill_attn_ktokens
        + c_prefill_seqs * prefill_seqs + c_moe * moe_experts

with add_request's host time per request and per prompt token (profile_admission),
written to toolkit/simulator/data/cost_models.json under "<device>/<shape>" (e.g.
"nvidia-h200/llama-3.1-8b"), and the samples with each one's fitted time to --out.

    python -m benchmarks sim_calibrate --shapes qwen3,llama8b
    python -m benchmarks sim_calibrate --tiny                  # the CPU check: a 2-layer Llama
    python -m benchmarks sim_calibrate --tiny-moe              # ... a 2-layer Qwen3-MoE, 32 experts top-4
    python -m benchmarks sim_calibrate --shapes qwen3moe       # Qwen3-30B-A3B on the GPU

moe_experts (a mixture-of-experts model's expected experts touched per step) is 0 for a
dense shape; its sweep adds decode batches from 1 up, along which that count rises from k to E.

benchmarks/sim_gpu_all.py does this too, then refits on live runs and validates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import GPU_SWEEP, MOE_GPU_SWEEP, SHAPE_NAMES, TINY_MOE_SWEEP, TINY_SWEEP, build_llm, release_llm  # noqa: E402


def calibrate(shape: str, args) -> dict:

    from toolkit.simulator import FEATURES, CostModel
    from toolkit.simulator.calibrate import device_key, profile_admission, profile_engine
    from toolkit.simulator.cost import moe_routing

    t0 = time.perf_counter()
    llm = build_llm(shape)
    built = time.perf_counter() - t0
    key = device_key(llm, SHAPE_NAMES[shape])
    print(f"[{key}] engine built in {built:.1f} s; sweeping step shapes", flush=True)
    sweep = dict({"tiny": TINY_SWEEP, "tiny-moe": TINY_MOE_SWEEP, "qwen3moe": MOE_GPU_SWEEP}.get(shape, GPU_SWEEP))
    if args.steps:
        sweep["steps"] = args.steps
    t = time.perf_counter()
    samples = profile_engine(llm, progress=True, **sweep)
    admission = profile_admission(llm)
    cost = CostModel.fit(samples, admission=admission, graph_tokens=llm.engine.runner.graph_tokens,
                         moe=moe_routing(llm.engine.model.config),
                         source=f"benchmarks/sim_calibrate.py on {key.split('/')[0]}, "
                                f"{time.strftime('%Y-%m-%d')}, {len(samples)} step shapes")
    cost.save(key, args.data) if args.data else cost.save(key)
    print(f"[{key}] {cost!r}\n  fit: mean relative error {cost.fit_error['mean_rel']:.1%}, "
          f"max {cost.fit_error['max_rel']:.1%} ({time.perf_counter() - t:.0f} s)", flush=True)
    rows = [dict(zip(FEATURES, x.tolist()), measured_s=y, fitted_s=float(cost.predict_features(x)))
            for x, y in samples]
    release_llm(llm)
    return dict(key=key, cost=cost.to_dict(), samples=rows, build_s=built)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3,llama8b", help="comma list of qwen3, llama8b, qwen3moe")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer CPU stand-in instead (a check)")
    ap.add_argument("--tiny-moe", action="store_true", help="the 2-layer CPU mixture-of-experts stand-in")
    ap.add_argument("--steps", type=int, default=0, help="timed steps per shape (0: the sweep's own)")
    ap.add_argument("--data", default=None, help="cost-model JSON to update (default: the shipped file)")
    ap.add_argument("--out", default=None, help="write the samples and fits here (JSON)")
    args = ap.parse_args()
    shapes = ["tiny"] if args.tiny else ["tiny-moe"] if args.tiny_moe else args.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPE_NAMES]
    if bad:
        raise SystemExit(f"unknown shape(s) {bad}; valid: {sorted(SHAPE_NAMES)}")
    results = dict(date=time.strftime("%Y-%m-%d"), runs=[calibrate(s, args) for s in shapes])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
