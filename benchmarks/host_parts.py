"""Where the host's time goes in a steady decode step, piece by piece, with no profiler.

torch.profiler inflates a CUDA-graph launch (CUPTI records every node: 0.6 ms a replay under
it, 13-18 us without; RESULTS engine core (o)) and cProfile inflates every Python call, so
neither says what the host really spends. This wraps named methods with perf_counter timers
(`benchmarks.step_diagnose.timed_method`; nested pieces are included in their parents) and
runs steady decode steps at each batch size, async scheduling as the engine defaults. On CUDA a
third pass times each step on the stream with two events (`add_observer(gpu_time=True)`: from
the step's first work to its tokens' copy, gaps included) and the host's wait for its tokens,
which together say whose the step is:

    python -m benchmarks host_parts --shape qwen3 --batches 16,256
    python -m benchmarks host_parts --shape tiny --batches 16      # CPU check of the script
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import model_config  # noqa: E402
from benchmarks.step_diagnose import timed_method  # noqa: E402


def pieces(eng) -> list[tuple[object, str, str]]:
    """(object, method, label) of the step's host pieces that exist on this engine."""
    r = eng.runner
    want = [(eng, "_land", "land (update/resolve + outputs of the step before)"),
            (eng.scheduler, "schedule", "schedule"), (eng.scheduler, "update", "update"),
            (eng.scheduler, "resolve_placeholders", "resolve_placeholders"),
            (eng.output_processor, "process", "outputs.process"),
            (r, "execute_model", "runner.execute_model"), (r, "prepare", "  prepare"),
            (r, "_batch", "    _batch"), (r, "sample_tokens", "runner.sample_tokens"),
            (r, "forward", "  forward"), (r, "hidden", "  hidden (the model, no LM head)"),
            (r.attention, "plan", "    attention.plan"),
            (r.model, "compute_logits", "    compute_logits"),
            (r, "_sample_plain", "  _sample_plain"), (r, "_metadata", "    sampling metadata")]
    if r.graphs is not None:
        want += [(r.graphs, "replay", "    graphs.replay"),
                 (r.attention, "use_static", "      static tables fill")]
    return [(o, m, label) for o, m, label in want if hasattr(o, m)]


def measure(llm, batch: int, steps: int, prompt: int) -> dict:
    from toolkit import SamplingParams

    eng = llm.engine
    vocab = eng.runner.model.spec.vocab_size
    rng = random.Random(batch)
    sp = SamplingParams(temperature=0.6, max_tokens=10_000, ignore_eos=True)
    ids = [eng.add_request([rng.randrange(vocab) for _ in range(prompt)], sp, output_kind="final")
           for _ in range(batch)]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(10):
        eng.step()
    walls = []
    for _ in range(steps):                  # plain steps first: no wrapper overhead
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
    spent: dict[str, float] = collections.defaultdict(float)
    with contextlib.ExitStack() as stack:
        for obj, name, _ in pieces(eng):
            stack.enter_context(timed_method(obj, name, spent))
        if eng.runner.device.type == "cuda":     # torch's replay itself (cudaGraphLaunch)
            stack.enter_context(timed_method(torch.cuda.CUDAGraph, "replay", spent, "cuda_graph_launch"))
        t = time.perf_counter()
        for _ in range(steps):
            eng.step()
        wrapped = time.perf_counter() - t
    gpu, wait = [], []                      # a third pass: the step's stream span (two events a step)
    record = lambda rec: (gpu.append(rec.gpu_time), wait.append(rec.wait_time))    # noqa: E731
    eng.add_observer(record, gpu_time=True)
    try:
        for _ in range(steps):
            eng.step()
    finally:
        eng.remove_observer(record)
    eng.abort(ids)
    while eng.has_unfinished():
        eng.step()
    timed = [g for g in gpu if g is not None]
    waited = [w for w in wait if w is not None]
    parts = {label: spent[name] / steps * 1e3 for _, name, label in pieces(eng) if name in spent}
    if "cuda_graph_launch" in spent:
        parts["      torch CUDAGraph.replay"] = spent["cuda_graph_launch"] / steps * 1e3
    return dict(batch=batch, step_ms=statistics.median(walls) * 1e3,
                wrapped_step_ms=wrapped / steps * 1e3, parts_ms=parts,
                gpu_ms=statistics.median(timed) * 1e3 if timed else None,
                host_wait_ms=statistics.median(waited) * 1e3 if waited else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3", help="qwen3, llama8b or tiny (CPU check)")
    ap.add_argument("--batches", default="16,256")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from toolkit import LLM

    tiny = args.shape == "tiny"
    batches = [int(b) for b in args.batches.split(",")]
    settings = (dict(device="cpu", dtype="float32", num_blocks=max(batches) * 64 + 64)
                if tiny else dict(dtype="bfloat16", gpu_memory_utilization=0.5))
    llm = LLM(model_config(args.shape), max_num_seqs=max(batches), max_num_batched_tokens=8192,
              max_model_len=4096, enable_prefix_caching=False, **settings)
    rows = []
    for b in batches:
        r = measure(llm, b, args.steps, args.prompt)
        rows.append(r)
        gpu = (f"; stream span {r['gpu_ms']:.2f} ms a step, the host waiting {r['host_wait_ms']:.2f} ms on it"
               if r["gpu_ms"] is not None else "")
        print(f"batch {b}: step {r['step_ms']:.2f} ms (with timers {r['wrapped_step_ms']:.2f}){gpu}; "
              "host pieces, ms a step (nested pieces inside their parents):", flush=True)
        for label, ms in r["parts_ms"].items():
            print(f"  {label:52s} {ms:7.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(shape=args.shape, date=time.strftime("%Y-%m-%d"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
