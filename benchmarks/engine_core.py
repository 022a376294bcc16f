"""Engine core: async scheduling against the synchronous loop, in one process on one GPU.

For each setting (sync, async) on the Qwen3-0.6B shape (random weights, bf16):
1. start-up: LLM(...) split into load / KV cache / warm-up (compiles, CUDA-graph captures),
   then the seconds of the first generate (which should compile nothing);
2. nano-vllm's protocol through the public LLM.generate: N requests, prompt and output lengths
   uniform in [100, 1024], temperature 0.6, ignore_eos; output tokens / wall second (warm);
3. a steady decode step at batch B (prompt --prompt, 512 by default; temperature 0.6): the median perf_counter time
   of engine.step() over 30 steps, against the GPU's busy time per step (sum of kernel times
   from torch.profiler over 10 such steps, per step); their ratio is the host's overhead.

    python -m benchmarks startup --num 256 --batch 256
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import time

import torch

from toolkit.engine.gc_freeze import GcPauses
from toolkit.kernels.compiles import triton_compiles


def nano_workload(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(100, 1024))], rng.randint(100, 1024))
            for _ in range(n)]


def gpu_busy_ms(fn, steps: int, kernels: dict | None = None) -> float:
    """Sum of CUDA kernel and copy times (ms) of `steps` calls of fn, per call; `kernels`, when
    given, is filled with {kernel name: [launches, ms]} per call."""
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if kernels is not None:
        for e in events:
            k = kernels.setdefault(e.name[:90], [0.0, 0.0])
            k[0] += 1 / steps
            k[1] += e.time_range.elapsed_us() / 1e3 / steps
    return sum(e.time_range.elapsed_us() for e in events) / 1e3 / steps


def host_syncs(eng, steps: int) -> list[str]:
    """What torch's sync debug mode flags in `steps` engine steps (calls that make the host wait
    for the GPU: .item(), pageable copies, stream syncs); the step's own wait for the tokens
    of the step before is an event wait, which it does not flag."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                eng.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message)[:300] for w in caught]


@contextlib.contextmanager
def gc_passes():
    """{generation: [passes, milliseconds]} of the cyclic collector while the block runs
    (engine/gc_freeze.GcPauses; filled when the block ends), and "first_full": what the first
    full pass walked (frozen objects, objects in generation 2, their commonest types)."""
    passes: dict = {}

    def census(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2 and "first_full" not in passes:
            import collections

            objs = gc.get_objects(generation=2)    # what the first full pass walks
            kinds = collections.Counter(type(o).__name__ for o in objs).most_common(8)
            passes["first_full"] = dict(frozen=gc.get_freeze_count(), gen2=len(objs), types=kinds)
            del objs

    gc.callbacks.append(census)                   # before GcPauses': the census is not timed
    try:
        with GcPauses() as pauses:
            yield passes
    finally:
        gc.callbacks.remove(census)
    passes.update({g: [n, round(t * 1e3, 2)] for g, (n, t) in pauses.by_generation.items()})


@contextlib.contextmanager
def _freeze(on: bool):
    """setting "<loop>-nofreeze": generate without engine/gc_freeze.frozen_heap (for the A/B)."""
    import toolkit.entrypoints.llm as llm_module

    if on:
        yield
        return
    kept = llm_module.frozen_heap
    llm_module.frozen_heap = lambda: contextlib.nullcontext()
    try:
        yield
    finally:
        llm_module.frozen_heap = kept


def run(setting: str, args, reqs) -> dict:
    from toolkit import LLM, SamplingParams
    from toolkit.models.shapes import llama31_8b, qwen3_0_6b

    cfg = qwen3_0_6b() if args.shape == "qwen3" else llama31_8b()
    t0 = time.perf_counter()
    loop, _, gc_mode = setting.partition("-")      # "async", "sync", "async-nofreeze", ...
    llm = LLM(cfg, dtype="bfloat16", max_num_seqs=args.batch, max_num_batched_tokens=8192,
              gpu_memory_utilization=0.6, enable_prefix_caching=False, max_model_len=4096,
              async_scheduling=loop == "async", quantization=args.quantization)
    build = time.perf_counter() - t0
    eng = llm.engine
    out = dict(setting=setting, startup=dict(eng.startup, total_s=build))
    t = time.perf_counter()
    llm.generate([[1] * 300, [2] * 20], SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True),
                 use_tqdm=False)
    out["first_generate_s"] = time.perf_counter() - t

    params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True) for _, n in reqs]
    torch.cuda.synchronize()
    with gc_passes() as passes, _freeze(gc_mode != "nofreeze"), triton_compiles(strict=False) as compiles:
        t = time.perf_counter()
        res = llm.generate([p for p, _ in reqs], params, use_tqdm=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
    out["gc_passes"] = passes
    out["compiles_in_generate"] = compiles      # what the warm-up missed
    print(f"[{setting}] Triton compiles inside the timed generate (kernel: count, s): {compiles}", flush=True)
    t = time.perf_counter()                     # the same workload again: nothing left to compile
    llm.generate([p for p, _ in reqs], params, use_tqdm=False)
    torch.cuda.synchronize()
    out["generate_again"] = dict(seconds=time.perf_counter() - t)
    out["generate_again"]["tok_s"] = sum(n for _, n in reqs) / out["generate_again"]["seconds"]
    print(f"[{setting}] generate again: {out['generate_again']['tok_s']:.0f} tok/s", flush=True)
    if args.generate_busy:       # the same generate again under the profiler: GPU-bound or not?
        busy = gpu_busy_ms(lambda: llm.generate([p for p, _ in reqs], params, use_tqdm=False), 1)
        out["generate_gpu_busy_s"] = busy / 1e3
        print(f"[{setting}] generate again under torch.profiler: GPU busy {busy / 1e3:.2f} s "
              f"(the timed run's wall: {dt:.2f} s)", flush=True)
    if args.diagnose:            # where the generate's wall goes, step by step
        from benchmarks.step_diagnose import diagnose, print_report

        out["diagnose"] = diagnose(llm, [p for p, _ in reqs], params)
        print_report(out["diagnose"], f"[{setting}] ")
    print(f"[{setting}] garbage-collector passes during generate (generation: count, ms): {passes}",
          flush=True)
    toks = sum(len(o.outputs[0].token_ids) for o in res)
    assert toks == sum(n for _, n in reqs)
    graphs = eng.runner.graphs
    out["generate"] = dict(requests=len(reqs), output_tokens=toks, seconds=dt, tok_s=toks / dt,
                           overlapped_steps=eng.num_overlapped_steps, steps=eng.num_steps,
                           whole_graph_steps=graphs.num_full_replays if graphs else 0,
                           piecewise_graph_steps=graphs.num_piecewise_replays if graphs else 0)
    print(f"[{setting}] generate: {toks} tokens in {dt:.1f} s = {toks / dt:.0f} tok/s", flush=True)

    # steady decode at batch B
    rng = random.Random(1)
    sp = SamplingParams(temperature=0.6, max_tokens=2000, ignore_eos=True)
    ids = [eng.add_request([rng.randrange(cfg.vocab_size) for _ in range(args.prompt)], sp, output_kind="final")
           for _ in range(args.batch)]          # as LLM.generate adds them
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(10):
        eng.step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(30):
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
    kernels: dict = {}
    busy = gpu_busy_ms(eng.step, 10, kernels)
    if args.kernels:             # the GPU time of a steady decode step, kernel by kernel
        top = sorted(kernels.items(), key=lambda kv: -kv[1][1])
        out["kernels"] = {k: [round(n, 1), round(ms, 4)] for k, (n, ms) in top}
        print(f"[{setting}] GPU time of a decode step at batch {args.batch}: {busy:.2f} ms in "
              f"{sum(n for n, _ in kernels.values()):.0f} launches; the top {args.kernels}:", flush=True)
        for k, (n, ms) in top[:args.kernels]:
            print(f"[{setting}]   {ms:7.3f} ms  x{n:4.0f}  {k}", flush=True)
    if args.roofline:            # the step's kernels against their floors (benchmarks/roofline.py)
        from benchmarks import roofline

        copy_bw, mm = roofline.measure_peaks()
        lens = [r.num_computed_tokens + 1 for r in eng.scheduler.requests.values()]
        rows = roofline.roofline_table(kernels, roofline.decode_step_work(roofline.Geometry.of(eng.runner.model.config), lens),
                                       copy_bw, mm)
        out["roofline"] = dict(copy_bw=copy_bw, matmul_flops=mm, batch=len(lens),
                               mean_context=sum(lens) / len(lens), rows=rows)
        print(f"[{setting}] roofline of a decode step at batch {len(lens)} (mean context "
              f"{sum(lens) / len(lens):.0f}; copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} "
              f"TFLOP/s):", flush=True)
        print("\n".join(f"[{setting}] {line}" for line in roofline.format_table(rows).splitlines()), flush=True)
    out["host_syncs"] = host_syncs(eng, 5)
    print(f"[{setting}] synchronizing CUDA calls in 5 steady steps (torch sync debug mode): "
          f"{len(out['host_syncs'])} {out['host_syncs'][:3]}", flush=True)
    if args.cprofile:            # where the host's time goes in these steps
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.cprofile):
            eng.step()
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        out["cprofile"] = buf.getvalue()
        print(f"[{setting}] cProfile of {args.cprofile} steady decode steps (tottime):\n"
              + buf.getvalue()[-6000:], flush=True)
    wall = statistics.median(walls) * 1e3
    out["decode"] = dict(batch=args.batch, prompt=args.prompt, wall_ms=wall, gpu_busy_ms=busy, ratio=wall / busy)
    print(f"[{setting}] decode step at batch {args.batch}: wall {wall:.2f} ms, GPU busy {busy:.2f} ms, "
          f"ratio {wall / busy:.2f}", flush=True)
    eng.abort(ids)
    llm.close()
    del llm, eng
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shape", choices=["qwen3", "llama8b"], default="qwen3")
    ap.add_argument("--settings", default="sync,async",
                    help="comma-separated: sync, async, and either with -nofreeze (generate "
                         "without freezing the heap, engine/gc_freeze.py)")
    ap.add_argument("--generate-busy", action="store_true",
                    help="run generate a second time under torch.profiler for its GPU busy time")
    ap.add_argument("--diagnose", action="store_true",
                    help="generate again, instrumented (benchmarks/step_diagnose.py)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt length of the steady decode")
    ap.add_argument("--kernels", type=int, default=0, help="print the N costliest kernels of a decode step")
    ap.add_argument("--roofline", action="store_true",
                    help="the decode step's kernels by kind against their floors (benchmarks/roofline.py)")
    ap.add_argument("--cprofile", type=int, default=0, help="profile N steady decode steps (host)")
    ap.add_argument("--quantization", default=None,
                    help="EngineConfig.quantization: 'fp8' quantizes the random bf16 weights at load")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from toolkit.models.shapes import llama31_8b, qwen3_0_6b

    reqs = nano_workload(args.num, (qwen3_0_6b() if args.shape == "qwen3" else llama31_8b()).vocab_size)
    results = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), shape=args.shape,
                   runs=[run(s, args, reqs) for s in args.settings.split(",")])
    print(json.dumps(results, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
