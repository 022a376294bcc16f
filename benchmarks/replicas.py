"""Data-parallel replicas on one H200: 2 replicas of the Qwen3-0.6B shape (random weights)
sharing the GPU against 1 replica, and prefix affinity against round robin on a
shared-prefix trace; plus the router's own cost per request.

1. Router cost: `views()` + `choose()` of each router over N replica views, per request
   (the work the front adds to every request), in microseconds.
2. Throughput: the same random-prompt requests, all at once, on 1 replica (AsyncEngine in
   its own process, --gpu-memory-utilization) and on 2 mp replicas on the one GPU (each
   half of it), round robin and least loaded: output tok/s, mean and p90 TTFT.
3. Shared prefix: requests after one of --system-prompts system prompts of
   --system-prompt-len tokens, arriving as a Poisson process; round robin against prefix
   affinity and cache aware on 2 replicas: the prefix-cache hit rate (cached prompt tokens
   / prompt tokens, from each request's metrics), mean and p90 TTFT.

    python -m benchmarks replicas                   # H200: about 5 minutes
    python -m benchmarks replicas --tiny --num 24   # the CPU check of the script itself
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import model_config, tiny_config  # noqa: E402


def router_cost(replicas: int, n: int = 20000) -> dict:
    from toolkit.registry import REGISTRY, create_part
    from toolkit.routing import ReplicaView, RouteRequest

    rng = np.random.default_rng(0)
    views = [ReplicaView(i, num_running=int(rng.integers(0, 64)), num_waiting=int(rng.integers(0, 8)),
                         kv_usage=float(rng.random())) for i in range(replicas)]
    reqs = [RouteRequest(f"r{k}", tuple(rng.integers(0, 150000, 512).tolist())) for k in range(256)]
    out = {}
    for name in REGISTRY["router"]:
        router = create_part("router", name, block_size=16)
        t0 = time.perf_counter()
        for k in range(n):
            router.choose(reqs[k % len(reqs)], views)
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


async def drive(engine, prompts: list[list[int]], params, arrivals: list[float] | None) -> dict:
    """Run every prompt (at its arrival, or all at once); TTFT, tokens, cached tokens."""
    t0 = time.perf_counter()
    ttft, tokens, cached, prompt_tokens = [], 0, 0, 0

    async def one(k: int, p: list[int]) -> None:
        nonlocal tokens, cached, prompt_tokens
        if arrivals is not None:
            await asyncio.sleep(max(0.0, arrivals[k] - (time.perf_counter() - t0)))
        start, first = time.perf_counter(), None
        stream = await engine.add_async(p, params)
        async for out in stream.iterate("delta"):
            if first is None and any(c.token_ids for c in out.outputs):
                first = time.perf_counter() - start
            tokens += sum(len(c.token_ids) for c in out.outputs)
            if out.finished and out.metrics is not None:
                cached += out.metrics.num_cached_tokens
                prompt_tokens += len(p)
        ttft.append(first if first is not None else float("nan"))

    await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    t = np.array(ttft)
    return dict(output_tok_s=tokens / wall, wall_s=wall, ttft_mean_ms=float(np.nanmean(t) * 1e3),
                ttft_p90_ms=float(np.nanpercentile(t, 90) * 1e3), hit_rate=cached / max(prompt_tokens, 1))


def build(model, replicas: int, router: str, opts: dict):
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.entrypoints.data_parallel import DPAsyncEngine

    if replicas == 1:
        return AsyncEngine.build(model, process=True, **opts)
    return DPAsyncEngine(model, data_parallel_size=replicas, backend="mp", router=router,
                         **{**opts, "gpu_memory_utilization": opts.get("gpu_memory_utilization", 0.8) / replicas})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model on the CPU (checks the script)")
    ap.add_argument("--num", type=int, default=1000, help="requests per run")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--system-prompts", type=int, default=64)
    ap.add_argument("--system-prompt-len", type=int, default=2048)
    ap.add_argument("--num-blocks", type=int, default=4096,
                    help="KV blocks (of 16 tokens) per replica in the shared-prefix runs: about half "
                         "of the system prompts fit, so where they are sent matters")
    ap.add_argument("--rate", type=float, default=20.0, help="requests / s of the shared-prefix runs")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from toolkit import SamplingParams

    if a.tiny:
        model, opts = tiny_config(), dict(num_blocks=512, block_size=16, max_num_seqs=16)
        a.prompt_len, a.output_len, a.system_prompt_len = min(a.prompt_len, 32), min(a.output_len, 8), 64
        a.system_prompts, a.num_blocks = 4, 512
    else:
        model = model_config("qwen3")
        opts = dict(load_format="dummy", gpu_memory_utilization=a.gpu_memory_utilization)
    vocab = 500 if a.tiny else 150000
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=a.output_len, temperature=0.0, ignore_eos=True)
    results: dict = {"router_cost_us": {n: router_cost(n, 2000 if a.tiny else 20000) for n in (2, 8)}}
    print("router cost per request (us):", json.dumps(results["router_cost_us"], indent=1))

    prompts = [rng.integers(3, vocab, a.prompt_len).tolist() for _ in range(a.num)]
    results["throughput"] = {}
    for replicas, router in ((1, "-"), (2, "round_robin"), (2, "least_loaded")):
        engine = build(model, replicas, router, opts)
        try:
            r = asyncio.run(drive(engine, prompts, params, None))
        finally:
            engine.close()
        results["throughput"][f"{replicas} x {router}"] = r
        print(f"throughput {replicas} replica(s) {router:<14} {r['output_tok_s']:9.0f} tok/s  "
              f"TTFT mean {r['ttft_mean_ms']:.1f} ms p90 {r['ttft_p90_ms']:.1f} ms", flush=True)

    systems = [rng.integers(3, vocab, a.system_prompt_len).tolist() for _ in range(a.system_prompts)]
    shared = [systems[int(rng.integers(a.system_prompts))] + rng.integers(3, vocab, a.prompt_len // 4).tolist()
              for _ in range(a.num)]
    arrivals = np.cumsum(rng.exponential(1.0 / a.rate, a.num)).tolist()
    results["shared_prefix"] = {}
    shared_opts = {**opts, "num_blocks": a.num_blocks}
    for router in ("round_robin", "prefix_affinity", "cache_aware"):
        engine = build(model, 2, router, shared_opts)
        try:
            r = asyncio.run(drive(engine, shared, params, arrivals))
        finally:
            engine.close()
        results["shared_prefix"][router] = r
        print(f"shared prefix 2 replicas {router:<16} hit rate {r['hit_rate']:.3f}  TTFT mean "
              f"{r['ttft_mean_ms']:.1f} ms p90 {r['ttft_p90_ms']:.1f} ms  {r['output_tok_s']:.0f} tok/s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
