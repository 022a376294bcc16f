"""Swap vs recompute preemption under memory pressure, long and short prompts, one run.

A KV pool too small for the batch forces preemptions; each (trace, preemption) pair runs
the same requests, all arriving at t = 0 (random weights at the Llama-3.1-8B shape on the
GPU, greedy, EOS ignored):
  long   requests with long prompts (GPU: 2048 tokens) and 256 output tokens: a victim has
         thousands of computed tokens; recompute prefills them again, swap copies them
  short  requests with short prompts (GPU: 128 tokens) and 512 output tokens
Preemption modes: recompute (no host tier), swap (a host pool of --cpu-cache-gb, pinned,
which also keeps the prefix cache's evictions), auto (the same pool; swap a victim with >=
schedulers.core.SWAP_MIN_TOKENS computed tokens, else recompute). Prefix caching is on (the
engine's default) in all three.
Reported: output tok/s, wall s, end-to-end latency (p50 / p99) of all requests and of the
preempted ones (those named in some step's preempted_ids), the number of preemptions (of
which swapped), blocks copied to and from the host, and the time the swap copies held the
stream (CUDA events around Runner.swap, summed: the copies run on the step's stream, so
this is what swap costs the steps).

    python -m benchmarks swap_vs_recompute --traces long
    python -m benchmarks swap_vs_recompute --traces short
    python -m benchmarks swap_vs_recompute --quick                                  # CPU check, ~1 min

The rule to check against: swap wins when a victim's computed tokens cost more to prefill
again than to copy out and back; at the 8B shape a token's KV is 128 KiB (bf16), ~5 us
each way over PCIe 5, against ~25-70 us of prefill per token at the batch sizes here.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

import torch

MODES = ("recompute", "swap", "auto")


def build(args, preemption: str, trace: str):
    from toolkit import LLM

    if args.quick:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                          num_key_value_heads=2, vocab_size=517, max_position_embeddings=4096,
                          eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
        kw = dict(dtype="float32", device="cpu", max_num_batched_tokens=256, max_num_seqs=16,
                  host_cache_blocks=512 if preemption != "recompute" else None)
    else:
        from toolkit.models.shapes import llama31_8b

        cfg = llama31_8b()
        kw = dict(dtype="bfloat16", max_num_batched_tokens=8192, max_num_seqs=args.max_num_seqs,
                  cpu_cache_gb=args.cpu_cache_gb if preemption != "recompute" else 0.0)
    return LLM(cfg, num_blocks=args.pool[trace], preemption=preemption, max_model_len=4096, **kw)


def traces(args) -> dict[str, tuple[list[list[int]], int]]:
    rng = random.Random(0)
    vocab = 517 if args.quick else 128256
    shapes = {"long": (args.num_long, 96 if args.quick else 2048, 40 if args.quick else 256),
              "short": (args.num_short, 8 if args.quick else 128, 40 if args.quick else 512)}
    out = {}
    for name in args.traces.split(","):
        n, plen, olen = shapes[name]
        out[name] = ([[rng.randrange(vocab) for _ in range(plen)] for _ in range(n)], olen)
    return out


def run(llm, prompts: list[list[int]], max_tokens: int, sync) -> dict:
    from toolkit import SamplingParams
    from toolkit.engine.gc_freeze import frozen_heap

    eng = llm.engine
    sched, runner = eng.scheduler, eng.runner
    preempted: set[str] = set()
    real_schedule, real_swap = sched.schedule, runner.swap
    swap_ms: list = []
    cuda = torch.cuda.is_available() and runner.device.type == "cuda"

    def schedule():
        out = real_schedule()
        preempted.update(out.preempted_ids)
        return out

    def swap(out):                        # the stream time the copies take (events, read at the end)
        if not cuda:
            t = time.perf_counter()
            real_swap(out)
            swap_ms.append((time.perf_counter() - t) * 1e3)
            return
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        real_swap(out)
        b.record()
        swap_ms.append((a, b))

    sched.schedule, runner.swap = schedule, swap
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    kv = sched.kv
    before = (eng.num_preemptions, kv.num_swap_preemptions, kv.num_swapped_out, kv.num_swapped_in)
    sync()
    t0 = time.perf_counter()
    ids = [eng.add_request(p, params, output_kind="final") for p in prompts]
    done: dict[str, float] = {}
    out_toks = 0
    with frozen_heap():     # as LLM.generate: no full GC pass inside a step
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = time.perf_counter() - t0
                    out_toks += len(o.outputs[0].token_ids)
    sync()
    wall = time.perf_counter() - t0
    sched.schedule, runner.swap = real_schedule, real_swap
    copies = sum(a.elapsed_time(b) for a, b in swap_ms) if cuda else sum(swap_ms)
    lat = [done[i] for i in ids]
    pre = [done[i] for i in ids if i in preempted]

    def q(xs, p):
        return 1e3 * (statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]) if xs else None

    return dict(requests=len(ids), output_tokens=out_toks, wall_s=wall, output_tok_s=out_toks / wall,
                latency_p50_ms=q(lat, 50), latency_p99_ms=q(lat, 99), preempted_requests=len(pre),
                preempted_latency_p50_ms=q(pre, 50), preempted_latency_p99_ms=q(pre, 99),
                preemptions=eng.num_preemptions - before[0], swap_preemptions=kv.num_swap_preemptions - before[1],
                blocks_swapped_out=kv.num_swapped_out - before[2], blocks_swapped_in=kv.num_swapped_in - before[3],
                swap_copy_ms=copies, steps=eng.num_steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny random Llama on the CPU")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {list(MODES)}")
    ap.add_argument("--traces", default="long,short")
    ap.add_argument("--num-long", type=int, default=None, help="long trace requests (GPU 64)")
    ap.add_argument("--num-short", type=int, default=None, help="short trace requests (GPU 256)")
    ap.add_argument("--pool-long", type=int, default=None, help="KV blocks for the long trace (GPU 3072)")
    ap.add_argument("--pool-short", type=int, default=None, help="KV blocks for the short trace (GPU 3072)")
    ap.add_argument("--cpu-cache-gb", type=float, default=8.0, help="host pool (GPU; 4096 blocks at 8B)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for m in args.modes.split(","):
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; valid: {list(MODES)}")
    q = args.quick
    args.num_long = args.num_long or (5 if q else 64)
    args.num_short = args.num_short or (10 if q else 256)
    # pools smaller than the admitted requests grow to: preemption is certain
    args.pool = {"long": args.pool_long or (20 if q else 3072), "short": args.pool_short or (12 if q else 3072)}
    cuda = torch.cuda.is_available() and not q
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    from toolkit.schedulers.core import SWAP_MIN_TOKENS

    results = dict(device=torch.cuda.get_device_name() if cuda else "cpu", date=time.strftime("%Y-%m-%d"),
                   shape="tiny-llama" if q else "llama3.1-8b", swap_min_tokens=SWAP_MIN_TOKENS,
                   args={k: v for k, v in vars(args).items()}, runs=[])
    for trace, (prompts, olen) in traces(args).items():
        for mode in args.modes.split(","):
            llm = build(args, mode, trace)
            from toolkit import SamplingParams

            llm.generate([[1] * (100 if args.quick else 300), [2] * 20], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                         use_tqdm=False)          # warm-up (kernel compiles) outside the timings
            r = run(llm, prompts, olen, sync)
            r.update(trace=trace, preemption=mode, num_blocks=args.pool[trace], prompt_len=len(prompts[0]),
                     output_len=olen)
            results["runs"].append(r)
            pp = r["preempted_latency_p99_ms"]
            print(f"[{trace:5s} {mode:9s}] {r['output_tok_s']:8.0f} out tok/s  {r['wall_s']:6.1f} s  "
                  f"p99 {r['latency_p99_ms']:8.0f} ms  preempted p99 {'-' if pp is None else round(pp):>8} ms  "
                  f"preemptions {r['preemptions']:4d} (swap {r['swap_preemptions']:4d})  "
                  f"blocks out/in {r['blocks_swapped_out']}/{r['blocks_swapped_in']}  "
                  f"copies {r['swap_copy_ms']:7.1f} ms", flush=True)
            llm.close()
            del llm
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
