"""Where one engine step's time goes: decode at batch B on the Qwen3-0.6B-shaped model.

Times prepare / forward / sample / update with syncs in between, then cProfiles a few
unsynchronised steps and prints the top functions. GPU only.

    python -m benchmarks profile_step --batch 256 --prompt 512
    python -m benchmarks profile_step --batch 256 --compare   # + whole steps: greedy vs mixed

It also replays one step's sampling alone, kernel by kernel (`sampling_kernels`), against the
forward's GPU time.
--compare also times whole unsynchronised engine steps (median wall time) of the same batch
with greedy parameters and with the mixed ones, so the difference is what the mixed sampling
step adds to a decode step as the engine runs it (host work overlapping the GPU included).
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
    ap.add_argument("--compare", action="store_true",
                    help="also time whole engine steps, greedy vs mixed, in the same run")
    ap.add_argument("--sync-steps", dest="async_steps", action="store_false",
                    help="profile whole steps with the synchronous loop (default: async scheduling)")
    ap.add_argument("--mixed", action="store_true",
                    help="mixed sampling parameters per request (benchmarks/sampling.py's mix), not greedy")
    args = ap.parse_args()
    from toolkit.models.shapes import qwen3_0_6b
    from toolkit import LLM, SamplingParams

    cfg = qwen3_0_6b()
    llm = LLM(cfg, dtype="bfloat16", max_num_seqs=args.batch, max_num_batched_tokens=16384,
              gpu_memory_utilization=0.5, enable_prefix_caching=False, max_model_len=4096,
              async_scheduling=False)      # the split timings below drive the parts by hand
    eng = llm.engine
    rng = random.Random(0)
    if args.compare:
        compare(eng, cfg.vocab_size, args)
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
        result = eng.runner.sample(batch, logits, eng.structured.grammars); t4 = time.perf_counter()
        eng.output_processor.process(out, eng.scheduler.update(out, result), result); t5 = time.perf_counter()
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
    sampling_kernels(eng, e0.elapsed_time(e1) / 5)
    eng.async_scheduling = args.async_steps   # whole steps: as the engine runs them by default
    for _ in range(3):
        eng.step()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        eng.step()
    sync()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


def sampling_kernels(eng, forward_ms: float) -> None:
    """The sampling step's GPU work, kernel by kernel: one engine step's own inputs (batch,
    logits, grammars) caught, then `runner.sample` replayed alone on them (torch.profiler), and
    its total against the forward's GPU time."""
    from benchmarks.sampling import kernel_table

    sample, plain = eng.runner.sample, eng.runner._sample_plain
    caught = {}

    def catch(batch, logits, grammars=None):      # the engine's step samples through _sample_plain
        caught.update(batch=batch, logits=logits.clone(), grammars=grammars)
        return plain(batch, logits, grammars)
    eng.runner._sample_plain = catch
    try:
        eng.step()
    finally:
        del eng.runner._sample_plain
    buf = torch.empty_like(caught["logits"])
    rows = kernel_table(lambda: sample(caught["batch"], buf.copy_(caught["logits"]),
                                       caught["grammars"]))
    total = sum(v for _, v in rows[1:])            # rows[0]: the refill of the logits buffer
    print(f"the sampling step's GPU work, one step (us, launch order; the first row is the "
          f"benchmark's refill of the logits, not counted): {total:.0f} us = "
          f"{total / 1e3 / forward_ms * 100:.1f}% of the forward's {forward_ms:.2f} ms\n  "
          + "\n  ".join(f"{v:8.1f}  {k}" for k, v in rows))


def step_times(eng, params: list, vocab: int, args) -> list[float]:
    """Wall seconds of args.steps * 3 decode steps of len(params) requests, after prefill and
    args.warmup steps; the requests are aborted afterwards."""
    rng = random.Random(1)
    ids = [eng.add_request([rng.randrange(vocab) for _ in range(args.prompt)], p) for p in params]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(args.warmup):
        eng.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps * 3):
        t = time.perf_counter()
        eng.step()                        # ends with the step's device->host copy of tokens
        times.append(time.perf_counter() - t)
    eng.abort(ids)
    while eng.has_unfinished():
        eng.step()
    return times


def compare(eng, vocab: int, args) -> None:
    """Median whole-step time, greedy vs the mixed sampling parameters, same batch and lengths."""
    from toolkit import SamplingParams
    from benchmarks.sampling import mixed_params

    greedy = [SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)] * args.batch
    mixed = [dataclasses.replace(p, max_tokens=1000, ignore_eos=True) for p in mixed_params(args.batch)]
    med = {}
    for label, params in (("greedy", greedy), ("mixed", mixed), ("greedy again", greedy)):
        ts = sorted(step_times(eng, params, vocab, args))
        med[label] = ts[len(ts) // 2] * 1e3
        print(f"whole step, {label}: median {med[label]:.2f} ms (p10 {ts[len(ts) // 10] * 1e3:.2f}, "
              f"p90 {ts[len(ts) * 9 // 10] * 1e3:.2f})")
    base = (med["greedy"] + med["greedy again"]) / 2
    print(f"mixed sampling adds {med['mixed'] - base:.2f} ms to a {base:.2f} ms greedy step "
          f"({(med['mixed'] - base) / med['mixed'] * 100:.1f}% of the mixed step)")


if __name__ == "__main__":
    main()
