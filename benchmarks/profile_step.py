"""Where one engine step's time goes: decode at batch B on the Qwen3-0.6B-shaped model.

Times prepare / forward / sample / update with syncs in between, then cProfiles a few
unsynchronised steps and prints the top functions. GPU only.

    python benchmarks/profile_step.py --batch 256 --prompt 512
"""

from __future__ import annotations

import argparse
import dataclasses
import cProfile
import pstats
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--mixed", action="store_true",
                    help="mixed sampling parameters per request (benchmarks/sampling.py's mix), not greedy")
    args = ap.parse_args()
    from toolkit.models.shapes import qwen3_0_6b
    from toolkit import LLM, SamplingParams

    cfg = qwen3_0_6b()
    llm = LLM(cfg, dtype="bfloat16", max_num_seqs=args.batch, max_num_batched_tokens=16384,
              gpu_memory_utilization=0.5, enable_prefix_caching=False, max_model_len=4096)
    eng = llm.engine
    rng = random.Random(0)
    if args.mixed:
        from benchmarks.sampling import mixed_params
        params = [dataclasses.replace(p, max_tokens=1000, ignore_eos=True) for p in mixed_params(args.batch)]
    else:
        params = [SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)] * args.batch
    for p in params:
        eng.add_request([rng.randrange(cfg.vocab_size) for _ in range(args.prompt)], p)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(args.warmup):          # past first-use compiles (growing lengths, new variants)
        eng.step()
    torch.cuda.synchronize()
    sync = torch.cuda.synchronize
    acc = dict(schedule=0.0, prepare=0.0, forward=0.0, sample=0.0, update=0.0)
    for _ in range(args.steps):
        t = time.perf_counter(); out = eng.scheduler.schedule(); t1 = time.perf_counter()
        batch = eng.runner.prepare(out); sync(); t2 = time.perf_counter()
        logits = eng.runner.forward(batch); sync(); t3 = time.perf_counter()
        toks, _ = eng.runner.sample(batch, logits, eng.grammars); t4 = time.perf_counter()
        sampled = {r.request_id: x for r, x in zip(batch.sampling, toks)}
        eng.output_processor.process(eng.scheduler.update(out, sampled)); t5 = time.perf_counter()
        for k, v in zip(acc, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            acc[k] += v
    print("per step (ms):", {k: round(v / args.steps * 1e3, 2) for k, v in acc.items()})
    # forward alone, with CUDA events, to split GPU from host launch time
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batch = eng.runner.prepare(eng.scheduler.schedule())
    t = time.perf_counter(); e0.record()
    for _ in range(5):
        eng.runner.forward(batch)
    e1.record(); host = (time.perf_counter() - t) / 5; sync()
    print(f"forward: host launch {host * 1e3:.2f} ms/step, GPU {e0.elapsed_time(e1) / 5:.2f} ms/step")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eng.runner.forward(batch); sync()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        eng.step()
    sync()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
