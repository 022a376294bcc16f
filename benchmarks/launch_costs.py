"""What one launch costs the host: a CUDA-graph replay by node count and by what the GPU is
doing, a Triton kernel through its Python launch path, a torch op, a pinned upload.

The nano workload's decode steps are host-bound (RESULTS, engine core (o)): cudaGraphLaunch
took 0.6 ms a step on average for a forward of about 310 kernels, and the sampler's Triton
launches cost more on the host than on the GPU. This separates the mechanisms. Each figure
is the median host time (perf_counter) of one call, in microseconds, warm:

- graph replay, N kernel nodes (a trivial Triton kernel or a torch add), with the GPU idle
  (synchronized before each replay), with the same graph already in flight (replayed back to
  back; a graph exec is ordered behind its own previous launch), and with two captures of the
  same work alternated (the other one in flight);
- a Triton kernel launched through `kernel[grid](...)`, and a torch in-place add;
- a 4 KiB pinned host-to-device copy (non_blocking).

    python -m benchmarks launch_costs
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


def _kernels(x: torch.Tensor, n: int, kind: str) -> None:
    for _ in range(n):
        if kind == "triton":
            _add_one[(1,)](x, x.numel(), BLOCK=256)
        else:
            x.add_(1.0)


def _capture(x: torch.Tensor, n: int, kind: str) -> torch.cuda.CUDAGraph:
    _kernels(x, 2, kind)                       # compiled outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        _kernels(x, n, kind)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def _median_us(fn, reps: int, sync_each: bool) -> float:
    times = []
    for _ in range(reps):
        if sync_each:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def graph_costs(nodes: list[int], kind: str, reps: int) -> list[dict]:
    rows = []
    for n in nodes:
        x = torch.zeros(256, device="cuda")
        a, b = _capture(x, n, kind), _capture(x, n, kind)
        for g in (a, b):
            g.replay()
        torch.cuda.synchronize()
        idle = _median_us(a.replay, reps, sync_each=True)
        same = _median_us(a.replay, reps, sync_each=False)
        turns = itertools.cycle((a, b))
        alt = _median_us(lambda: next(turns).replay(), reps, sync_each=False)
        # GPU time of one replay, for scale
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            a.replay()
        e1.record()
        torch.cuda.synchronize()
        rows.append(dict(kind=kind, nodes=n, idle_us=idle, in_flight_same_us=same,
                         alternating_two_us=alt, gpu_us=e0.elapsed_time(e1) * 100))
        print(f"graph of {n:4d} {kind:6s} kernels: replay host {idle:7.1f} us idle, {same:7.1f} us "
              f"behind itself, {alt:7.1f} us alternating two captures; GPU {rows[-1]['gpu_us']:.1f} us",
              flush=True)
    return rows


def single_costs(reps: int) -> dict:
    x = torch.zeros(256, device="cuda")
    _add_one[(1,)](x, x.numel(), BLOCK=256)
    host = torch.zeros(1024, dtype=torch.int32).pin_memory()
    dev = torch.empty(1024, dtype=torch.int32, device="cuda")
    out = dict(
        triton_launch_us=_median_us(lambda: _add_one[(1,)](x, x.numel(), BLOCK=256), reps, False),
        torch_add_us=_median_us(lambda: x.add_(1.0), reps, False),
        pinned_upload_us=_median_us(lambda: dev.copy_(host, non_blocking=True), reps, False),
        event_record_us=_median_us(lambda: torch.cuda.Event().record(), reps, False),
    )
    print("one call, host us: " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in out.items()), flush=True)
    return out


def engine_graph_costs(shape: str, buckets: list[int], reps: int) -> list[dict]:
    """The engine's whole-forward graphs (random weights at `shape`): replay host time idle and
    behind itself, per bucket."""
    from benchmarks.sim_common import model_config
    from toolkit import LLM

    llm = LLM(model_config(shape), dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192,
              gpu_memory_utilization=0.5, enable_prefix_caching=False, max_model_len=4096)
    graphs = llm.engine.runner.graphs
    rows = []
    for bp in buckets:
        g = graphs.graphs.get(bp)
        if g is None or "direct" not in g.full:
            print(f"bucket {bp}: no whole-forward graph", flush=True)
            continue
        graph = g.full["direct"][0]
        graph.replay()
        torch.cuda.synchronize()
        idle = _median_us(graph.replay, reps, sync_each=True)
        same = _median_us(graph.replay, reps, sync_each=False)
        rows.append(dict(shape=shape, bucket=bp, idle_us=idle, in_flight_same_us=same))
        print(f"{shape} whole-forward graph, bucket {bp}: replay host {idle:.1f} us idle, "
              f"{same:.1f} us behind itself", flush=True)
    llm.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,30,100,300,600")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--engine", default="qwen3", help="shape whose engine graphs to time ('' = none)")
    ap.add_argument("--buckets", default="16,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    nodes = [int(n) for n in args.nodes.split(",")]
    res = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
               torch=torch.__version__, cuda=torch.version.cuda, triton=triton.__version__,
               single=single_costs(args.reps * 5),
               graphs=graph_costs(nodes, "triton", args.reps) + graph_costs(nodes, "torch", args.reps))
    if args.engine:
        res["engine"] = engine_graph_costs(args.engine, [int(b) for b in args.buckets.split(",")],
                                           args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
