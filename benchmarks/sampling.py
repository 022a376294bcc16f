"""Sampling-step time: the fast sampler vs the float64 reference vs a naive torch sampler.

    python -m benchmarks sampling            # GPU: batch 1/64/256 x V=151936
    python -m benchmarks sampling --small       # CPU smoke run

Every row of a batch has its own parameters (greedy, top-k, top-p, min-p, penalties, seeds,
logprobs mixed). Times are medians over --iters after --warmup (CUDA events on the GPU).
The naive peer is softmax + full sort + top-k/top-p masks + multinomial on the same logits;
"staged" is the fast sampler's stages run one by one, materialised (no fused tail).
SamplingMetadata.build (host side, once per step) is timed separately.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Callable

import torch

from toolkit.samplers import ReferenceSampler, Sampler, SamplingMetadata
from toolkit.samplers.logprobs import gather_logprobs
from toolkit.kernels.kth_largest import kth_largest_radix as kth_radix
from toolkit.kernels.reference_sampling import kth_largest as kth_topk
from toolkit.samplers.stages import fusable_tail, kernel
from toolkit.types import SamplingParams


def mixed_params(n: int) -> list[SamplingParams]:
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.7, top_k=50),
        dict(temperature=1.0, top_p=0.9),
        dict(temperature=0.8, top_k=100, top_p=0.95, min_p=0.05),
        dict(temperature=1.0, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.2),
        dict(temperature=0.9, top_p=0.8, seed=1234, logprobs=5),
    ]
    return [SamplingParams(**kinds[i % len(kinds)]) for i in range(n)]


def naive_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    """The textbook batch sampler: temperature, full sort, top-k / top-p masks, multinomial."""
    x = logits / temperature.clamp(min=1e-5)[:, None]
    srt, idx = x.sort(dim=-1, descending=True)                             # [N, V]
    pos = torch.arange(x.shape[1], device=x.device)[None, :]
    srt = srt.masked_fill((top_k[:, None] > 0) & (pos >= top_k[:, None]), float("-inf"))
    probs = srt.softmax(dim=-1)
    cum = probs.cumsum(dim=-1)
    srt = srt.masked_fill(cum - probs > top_p[:, None], float("-inf"))
    choice = torch.multinomial(srt.softmax(dim=-1), 1)                       # [N, 1]
    return idx.gather(1, choice).squeeze(1)


def timer(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds of fn()."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_timer(fn: Callable[[], object], iters: int) -> float | None:
    """Median milliseconds of fn() replayed from a CUDA graph: its GPU time alone, without
    the host's launch overhead (None if fn cannot be captured)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            fn(), fn()                                  # compiles and allocations first
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:                           # e.g. an RNG call the graph cannot hold
        print(f"  (not capturable: {str(e).splitlines()[0][:100]})")
        torch.cuda.synchronize()
        return None
    return timer(graph.replay, torch.device("cuda"), 2, iters)


def staged(sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """The unfused pipeline: every stage materialised, then the race (the pre-fusion path)."""
    x = sampler.process(logits, meta)
    return kernel("gumbel_sample", x, sampler.use_triton)(x, sampler.keys(meta), meta.greedy)


def stage_breakdown(sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata,
                    device: torch.device, iters: int) -> dict[str, float]:
    """Median milliseconds of each piece of the fast sampler's call, timed one at a time."""
    copy = timer(lambda: logits.to(torch.float32, copy=True), device, 2, iters)
    out: dict[str, float] = {"copy": copy}
    cut = fusable_tail(sampler.stages)
    x0 = logits.to(torch.float32, copy=True)
    for stage in sampler.stages[:cut]:
        if getattr(stage, "active", lambda m: True)(meta):
            out[stage.name] = timer(lambda: stage(x0.clone(), meta), device, 2, iters) - copy
            x0 = stage(x0, meta)
    keys = sampler.keys(meta)
    kth = None
    if meta.top_k_rows is not None:
        kth_fn = kernel("kth_largest", x0, sampler.use_triton)
        kth = kth_fn(x0, meta.top_k, meta.top_k_rows, meta.max_top_k)
        out["kth"] = timer(lambda: kth_fn(x0, meta.top_k, meta.top_k_rows, meta.max_top_k),
                           device, 2, iters)
    tail = kernel("truncated_sample", x0, sampler.use_triton)
    out["fused tail"] = timer(lambda: tail(x0, meta.temperature, meta.greedy, meta.min_p, meta.top_k,
                                           meta.top_p, keys, kth), device, 2, iters)
    if device.type == "cuda":                   # GPU time alone, then the kernel's knobs swept
        gpu = graph_timer(lambda: tail(x0, meta.temperature, meta.greedy, meta.min_p, meta.top_k,
                                       meta.top_p, keys, kth), iters)
        if gpu is not None:
            out["fused tail, GPU only (graph)"] = gpu
        if kth is not None:
            for label, fn in (("kth (group filter)", kth_fn), ("kth (radix select)", kth_radix),
                              ("kth (torch.topk)", kth_topk)):
                gpu = graph_timer(lambda: fn(x0, meta.top_k, meta.top_k_rows, meta.max_top_k), iters)
                if gpu is not None:
                    out[f"{label}, GPU only (graph)"] = gpu

        for knobs in (dict(prefetch=0), dict(rounds=3), dict(skip=False), dict(late_chunk=8192),
                      dict(late_chunk=4096), dict(late_rows=64)):
            gpu = graph_timer(lambda: tail(x0, meta.temperature, meta.greedy, meta.min_p, meta.top_k,
                                           meta.top_p, keys, kth, **knobs), iters)
            if gpu is not None:
                out["tail " + " ".join(f"{k}={v}" for k, v in knobs.items()) + " (graph)"] = gpu
    if meta.max_num_logprobs is not None:
        toks = torch.zeros(meta.num_rows, dtype=torch.int64, device=logits.device)
        out["logprobs"] = timer(lambda: gather_logprobs(logits, toks, meta.max_num_logprobs,
                                                        meta.logprob_rows), device, 2, iters)
        if device.type == "cuda":
            gpu = graph_timer(lambda: gather_logprobs(logits, toks, meta.max_num_logprobs,
                                                      meta.logprob_rows), iters)
            if gpu is not None:
                out["logprobs, GPU only (graph)"] = gpu
        rows = meta.logprob_rows if meta.logprob_rows is not None else torch.arange(meta.num_rows)
        out["logprobs: its topk"] = timer(
            lambda: logits.index_select(0, rows).topk(meta.max_num_logprobs, dim=-1), device, 2, iters)
    return {k: round(v, 4) for k, v in out.items()}


def kernel_table(fn: Callable[[], object], calls: int = 11) -> list[tuple[str, float]]:
    """The GPU kernels of one fn() call in launch order, each with its median microseconds
    over `calls` profiled calls (torch.profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    per = len(evs) // calls
    return [(evs[i].name[:50], round(statistics.median(
        evs[c * per + i].time_range.elapsed_us() for c in range(calls)), 1)) for i in range(per)]


def run(batches: list[int], vocab: int, device: torch.device, warmup: int, iters: int,
        reference_iters: int, breakdown: bool = False, kernels: bool = False) -> list[dict]:
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    fast = Sampler(generator=gen)
    ref = ReferenceSampler()
    for n in batches:
        params = mixed_params(n)
        prompts = [list(range(i, i + 64)) for i in range(n)]
        outputs = [list(range(i, i + 16)) for i in range(n)]
        logits = torch.randn(n, vocab, device=device, generator=gen) * 4
        build = lambda: SamplingMetadata.build(params, prompts, outputs, vocab, device)  # noqa: E731
        meta = build()
        t = torch.tensor([p.temperature for p in params], device=device)
        k = torch.tensor([p.top_k for p in params], device=device)
        p_ = torch.tensor([p.top_p for p in params], device=device)
        row = {
            "batch": n, "vocab": vocab, "device": str(device),
            "build_ms": timer(build, device, 1, max(1, iters // 4)),
            "fast_ms": timer(lambda: fast(logits, meta), device, warmup, iters),
            "staged_ms": timer(lambda: staged(fast, logits, meta), device, warmup, iters),
            "naive_ms": timer(lambda: naive_sample(logits, t, k, p_), device, warmup, iters),
            "reference_ms": timer(lambda: ref(logits, meta), device, 0, reference_iters),
        }
        if device.type == "cuda":    # the sampler's GPU time alone (no host launch overhead);
            graphed = Sampler()      # unseeded rows' keys from the default generator: capturable
            row["fast_gpu_ms"] = graph_timer(lambda: graphed(logits, meta), iters)
            # as the engine calls it: logits it no longer needs, processed in place (the copy
            # into `buf` stands for the forward's output and is timed apart, then subtracted)
            buf = torch.empty_like(logits)
            refill = graph_timer(lambda: buf.copy_(logits), iters)
            both = graph_timer(lambda: graphed(buf.copy_(logits), meta, consume_logits=True), iters)
            if refill is not None and both is not None:
                row["fast_gpu_engine_ms"] = both - refill
        if kernels and device.type == "cuda":
            buf = torch.empty_like(logits)            # the first copy: the forward's output
            row["kernels_us"] = kernel_table(lambda: fast(buf.copy_(logits), meta, consume_logits=True))
            print(f"batch {n} kernels (us, launch order; total "
                  f"{sum(v for _, v in row['kernels_us']):.0f}):\n  " + "\n  ".join(
                      f"{v:8.1f}  {k}" for k, v in row["kernels_us"]))
        if breakdown:
            row["breakdown_ms"] = stage_breakdown(fast, logits, meta, device, iters)
            print(f"batch {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in row["breakdown_ms"].items()))
        row["speedup_vs_naive"] = row["naive_ms"] / row["fast_ms"]
        row["speedup_vs_reference"] = row["reference_ms"] / row["fast_ms"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--vocab", type=int, default=151_936, help="Qwen3's vocabulary by default")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--reference-iters", type=int, default=1, help="the reference is slow: few runs")
    ap.add_argument("--breakdown", action="store_true", help="also time each stage on its own")
    ap.add_argument("--kernels", action="store_true", help="GPU time of each kernel (torch.profiler)")
    ap.add_argument("--small", action="store_true", help="CPU smoke sizes: batch 1 4, V 4096, 3 iters")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    if a.small:
        a.batch, a.vocab, a.warmup, a.iters = [1, 4], 4096, 1, 3
    rows = run(a.batch, a.vocab, torch.device(a.device), a.warmup, a.iters, a.reference_iters, a.breakdown,
               a.kernels)
    cols = ["batch", "vocab", "build_ms", "fast_ms", "fast_gpu_ms", "fast_gpu_engine_ms", "staged_ms", "naive_ms",
            "reference_ms", "speedup_vs_naive", "speedup_vs_reference"]
    print(" ".join(f"{c:>20}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c):>20.3f}" if isinstance(r.get(c), float) else f"{r.get(c)!s:>20}"
                       for c in cols))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"benchmark": "sampling", "rows": rows}, indent=2))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
