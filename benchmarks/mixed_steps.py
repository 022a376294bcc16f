"""Eager mixed steps with and without the TMA prefill path: the same step shapes, one machine, one process.

Call (i) of the simulator work (RESULTS, simulator update (i)) found the sweep's small eager
mixed steps (decodes beside a prompt, more tokens than the CUDA graphs hold) 1.3-2x slower than
in call (h), and its large ones faster; between the two the engine gained the TMA prefill path
(toolkit/kernels/self_attention.py), and the machine changed. This script tells the two apart:
it builds the engine of sim_common twice, TritonPagedAttention as configured ("tma") and with
its TMA prefill path off ("paged", `throughput.paged_prefill_attention`), and for each step
shape (the calibration sweep's mixes, a long prompt, a decode batch for reference) it reports:
- wall ms a step (`engine.step()`, as the calibration times it) and GPU stream ms a step
  (`StepRecord.gpu_time`);
- the CUDA caching allocator's device mallocs, frees and retries over the shape's timed steps
  (a cudaFree waits for the device);
- with --profile, the device time of the kernels (their intervals' union, the profiler's own
  step ranges left out) and the costliest kernels, over the shape's timed steps.

    python -m benchmarks mixed_steps --shape llama8b
    python -m benchmarks mixed_steps --quick          # the tiny CPU model: a check of the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.sim_common import GPU_SWEEP, TINY_SWEEP, build_llm, release_llm  # noqa: E402
from benchmarks.step_gaps import busy_seconds, is_annotation  # noqa: E402
from benchmarks.throughput import paged_prefill_attention  # noqa: E402


def shapes_of(quick: bool) -> list[tuple[int, int, int, int]]:
    """(decodes B, their context L, prompt tokens P, prompts k): the sweep's mixes, one long
    prompt, one decode batch."""
    sweep = TINY_SWEEP if quick else GPU_SWEEP
    mixed = [(m[0], m[1], m[2], m[3] if len(m) > 3 else 1) for m in sweep["mixed"]]
    return mixed + ([(0, 0, 256, 1), (8, 64, 0, 1)] if quick else [(0, 0, 1024, 1), (32, 512, 0, 1)])


def time_shape(llm, b: int, c: int, p: int, k: int, steps: int, warmup: int, profile: bool) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from toolkit.simulator.calibrate import _Shapes
    from toolkit.simulator.replay import _cuda_allocator_counts

    sh = _Shapes(llm.engine, steps, warmup, seed=b * 7 + p)
    try:
        ids = sh.decoders(b, c) if b else []
        first = len(sh.rec.steps)
        cuda = torch.cuda.is_available()
        alloc0 = _cuda_allocator_counts(llm.engine)
        prof = None
        if profile and cuda:
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _, wall, dropped = sh.timed(p or None, k)
        else:
            _, wall, dropped = sh.timed(p or None, k)
        recs = sh.rec.steps[first + warmup:]
        gpu = [r.gpu for r in recs if r.gpu is not None]
        row = dict(decodes=b, context=c, prompt_tokens=p, prompts=k, steps=len(recs), wall_ms=1e3 * wall,
                   gpu_ms=1e3 * statistics.fmean(gpu) if gpu else None, outliers=dropped)
        alloc1 = _cuda_allocator_counts(llm.engine)
        if alloc0 is not None and alloc1 is not None:   # cudaMalloc / cudaFree inside the timed steps
            row["cuda_allocator"] = {key: alloc1[key] - alloc0[key] for key in alloc0}
        if prof is not None:
            spans, kernels = [], {}
            for e in prof.events():
                if e.device_type != DeviceType.CUDA or is_annotation(e):
                    continue
                spans.append((e.time_range.start * 1e-6, e.time_range.end * 1e-6))
                kernels[e.name[:70]] = kernels.get(e.name[:70], 0.0) + e.time_range.elapsed_us() * 1e-3
            n = warmup + steps                  # the profile holds the warm-up steps too
            row["kernel_ms"] = 1e3 * busy_seconds(spans) / n
            row["top_kernels_ms"] = {name: ms / n for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:8]}
        sh.drain(ids)
        return row
    finally:
        sh.rec.detach()
        sh.drain()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b", help="llama8b or qwen3; --quick: the tiny CPU model")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="kernel time and the costliest kernels per shape")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = "tiny" if args.quick else args.shape
    variants = {"tma": {}, "paged": dict(attention=paged_prefill_attention)}
    if args.quick:                               # the CPU: the Triton backend's reference twins
        variants["tma"] = dict(attention="triton")
    rows = []
    t0 = time.perf_counter()
    for name, overrides in variants.items():
        llm = build_llm(shape, **overrides)
        print(f"[{name}] {type(llm.engine.runner.attention).__name__}, TMA prefill tile "
              f"{getattr(llm.engine.runner.attention, '_self_tile', None)} [{time.perf_counter() - t0:.0f} s]", flush=True)
        for b, c, p, k in shapes_of(args.quick):
            row = dict(variant=name, **time_shape(llm, b, c, p, k, args.steps, args.warmup, args.profile))
            rows.append(row)
            gpu = "n/a" if row["gpu_ms"] is None else f"{row['gpu_ms']:7.2f}"
            kern = f"  kernels {row['kernel_ms']:7.2f}" if "kernel_ms" in row else ""
            if "cuda_allocator" in row:
                kern += "  mallocs/frees/retries {num_device_alloc}/{num_device_free}/{num_alloc_retries}".format(
                    **row["cuda_allocator"])
            print(f"  {name:5s} B={b:<4d} L={c:<5d} P={p:<5d} k={k}: wall {row['wall_ms']:7.2f} ms, GPU {gpu} ms{kern}",
                  flush=True)
            if args.out:                         # after each shape: a timeout keeps what was done
                with open(args.out, "w") as f:
                    json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M"), argv=sys.argv[1:], rows=rows), f, indent=1)
        release_llm(llm)
    by = {(r["variant"], r["decodes"], r["context"], r["prompt_tokens"], r["prompts"]): r for r in rows}
    print("\nshape                         tma wall / GPU ms    paged wall / GPU ms    tma / paged (GPU)")
    for b, c, p, k in shapes_of(args.quick):
        a, z = by.get(("tma", b, c, p, k)), by.get(("paged", b, c, p, k))
        if a and z:
            ratio = f"{a['gpu_ms'] / z['gpu_ms']:.2f}x" if a["gpu_ms"] and z["gpu_ms"] else "n/a"
            print(f"B={b:<4d} L={c:<5d} P={p:<5d} k={k}   {a['wall_ms']:7.2f} / {a['gpu_ms'] or 0:7.2f}     "
                  f"{z['wall_ms']:7.2f} / {z['gpu_ms'] or 0:7.2f}      {ratio}")


if __name__ == "__main__":
    main()
