"""The engine's host work per step, part by part, on any machine (the CPU included).

A decode step at batch B of a 1-layer model with tiny dimensions: the model and the sampler
cost next to nothing, so what a step costs is the host's bookkeeping that a GPU step pays
too (schedule, prepare, the attention plan, update, placeholders, outputs). Each part is
timed by wrapping its method with perf_counter; "other" is the step's time not in any
listed part (the engine's own glue, the sampler's launch path, the result's conversion).
The model forward and the sampler are listed but are compute, not host work, here.

    python -m benchmarks host_overhead --batch 256 --attention triton   # Triton's plan (reference kernels on the CPU)
    python -m benchmarks host_overhead --batch 256 --sync --cprofile 20

Numbers move with the machine's load; compare two versions back to back.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--attention", default="cpu", help="cpu (SDPA) or triton (its plan; reference kernels)")
    ap.add_argument("--temperature", type=float, default=0.6,
                    help="0: greedy (the CPU's argmax; 0.6 runs the CPU's slow Gumbel twin, timed as compute)")
    ap.add_argument("--output-kind", default="final",
                    help="add_request's: final (LLM.generate's) or cumulative (a RequestOutput per request "
                         "per step, as streaming and the simulator's run_on_engine take them)")
    ap.add_argument("--sync", action="store_true", help="the synchronous loop (default: async scheduling)")
    ap.add_argument("--cprofile", type=int, default=0, help="then cProfile this many steps")
    args = ap.parse_args()
    from transformers import Qwen3Config

    from benchmarks.step_diagnose import timed_method
    from toolkit import LLM, SamplingParams
    from toolkit.engine.gc_freeze import frozen_heap

    cfg = Qwen3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, intermediate_size=32, vocab_size=4096, tie_word_embeddings=True,
                      max_position_embeddings=4096, eos_token_id=1, bos_token_id=0)
    b = args.batch
    llm = LLM(cfg, dtype="float32", max_num_seqs=b, max_num_batched_tokens=16384,
              enable_prefix_caching=False, max_model_len=2048, num_blocks=b * 40 + 64,
              async_scheduling=not args.sync, attention=args.attention)
    eng = llm.engine
    spent: dict[str, float] = collections.defaultdict(float)

    parts = [(eng.scheduler, "schedule"), (eng.scheduler, "update"),
             (eng.scheduler, "resolve_placeholders"), (eng.runner, "prepare"),
             (eng.runner.attention, "plan"), (eng.runner.model, "forward"),
             (eng.runner, "_sample_plain"), (eng.output_processor, "process"), (eng, "_retire")]
    timers = contextlib.ExitStack()          # timed for the rest of the run
    for obj, name in parts:
        timers.enter_context(timed_method(obj, name, spent))
    rng = random.Random(0)
    for _ in range(b):
        eng.add_request([rng.randrange(4000) for _ in range(args.prompt)],
                        SamplingParams(max_tokens=100_000, temperature=args.temperature, ignore_eos=True),
                        output_kind=args.output_kind)
    for _ in range(5):                       # prefill and the first decodes
        eng.step()
    spent.clear()
    with frozen_heap():                      # as LLM.generate runs
        t = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        total = time.perf_counter() - t
    per = {k: v / args.steps * 1e3 for k, v in spent.items()}
    compute = per.get("forward", 0.0) + per.get("_sample_plain", 0.0)
    host = total / args.steps * 1e3 - compute
    # plan() runs inside forward(): it is host work, so it is added back
    host += per.get("plan", 0.0)
    print(f"batch {b}, {'sync' if args.sync else 'async'}, attention {args.attention}: "
          f"{total / args.steps * 1e3:.2f} ms a step, of which host work {host:.2f} ms")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        note = "  (compute)" if k in ("forward", "_sample_plain") else ""
        print(f"  {k:22s} {v:7.3f} ms{note}")
    listed = sum(v for k, v in per.items() if k not in ("forward", "_sample_plain", "plan"))
    print(f"  {'other':22s} {host - listed - per.get('plan', 0.0):7.3f} ms")
    if args.cprofile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.cprofile):
            eng.step()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
