"""Host time of a decode step's parts per running request: schedule, prepare, update, outputs.

The engine's host work grows with the running batch (about 57 us a step per running request
on the H200's host at 1.2x saturation, RESULTS simulator (l)); this times each part of it on
a tiny CPU model, where the forward is cheap, with the heap frozen as LLM.generate freezes it.
A part's time is the sum of its calls, divided by steps and running requests.

    python benchmarks/host_parts.py --batch 128 --steps 60
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (object path from the engine, method, label)
PARTS = (("scheduler", "schedule", "schedule"), ("runner", "prepare", "prepare"),
         ("scheduler", "update", "update"), ("scheduler", "resolve_placeholders", "update (async)"),
         ("output_processor", "process", "outputs"))


def timed_parts(engine, totals: dict[str, float]) -> None:
    """Wrap each part's method on its instance; its seconds accumulate in totals[label]."""
    for owner, name, label in PARTS:
        obj = getattr(engine, owner)
        fn = getattr(obj, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def wrapper(*a, _fn=fn, _label=label, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                totals[_label] = totals.get(_label, 0.0) + time.perf_counter() - t
        setattr(obj, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--output-kind", default="cumulative", help="add_request's output_kind")
    args = ap.parse_args()
    import torch
    from transformers import Qwen3Config

    from toolkit import LLM, SamplingParams

    torch.set_num_threads(1)
    cfg = Qwen3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, intermediate_size=32, vocab_size=4096, tie_word_embeddings=True,
                      max_position_embeddings=4096, eos_token_id=1, bos_token_id=0)
    b = args.batch
    with LLM(cfg, dtype="float32", device="cpu", max_num_seqs=b, max_num_batched_tokens=16384,
             max_model_len=2048, num_blocks=b * 40 + 64) as llm:
        eng = llm.engine
        rng = random.Random(0)
        for _ in range(b):
            eng.add_request([rng.randrange(4000) for _ in range(256)], SamplingParams(
                max_tokens=args.steps + 20, temperature=0.0, ignore_eos=True), output_kind=args.output_kind)
        for _ in range(5):                       # prefill, then decoding
            eng.step()
        totals: dict[str, float] = {}
        timed_parts(eng, totals)
        gc.collect()
        gc.freeze()
        try:
            t = time.perf_counter()
            for _ in range(args.steps):
                eng.step()
            wall = time.perf_counter() - t
        finally:
            gc.unfreeze()
    print(f"batch {b}, {args.steps} decode steps: {1e3 * wall / args.steps:.2f} ms a step (the CPU forward included)")
    for label, sec in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:15s} {1e6 * sec / args.steps / b:6.2f} us per running request  "
              f"({1e3 * sec / args.steps:.2f} ms a step)")


if __name__ == "__main__":
    main()
