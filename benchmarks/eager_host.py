"""Where the host's time goes in an eager step (a step larger than the largest CUDA graph).

On the H200 an eager 8B step's kernels were busy 16 ms of a 29-55 ms step, the host in
step() the whole time (RESULTS, simulator (l)); a Qwen3-0.6B prefill of 1024-8000 tokens took
29-37 ms where graphed steps of 512 took 6 ms (simulator (n), the Qwen3 sweep). This times
one prefill step of P prompt tokens (P > the graphs' limit: eager) as the engine runs it:
the host's time to issue the forward (no sync), the GPU's time (CUDA events), and a cProfile
of the forward's host side, top functions by own time.

    python -m benchmarks eager_host --shape qwen3 --prompt 2048
    python -m benchmarks eager_host --shape tiny --prompt 600    # CPU check of the script
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import model_config  # noqa: E402


def one_prefill(llm, prompt: int, rng: random.Random, profile: cProfile.Profile | None = None) -> dict:
    """Schedule one request of `prompt` tokens alone and run its step's forward by hand:
    host seconds to issue it, GPU seconds (events), then finish the request."""
    import torch

    from toolkit import SamplingParams

    eng = llm.engine
    vocab = eng.runner.model.spec.vocab_size
    rid = eng.add_request([rng.randrange(vocab) for _ in range(prompt)],
                          SamplingParams(max_tokens=1, temperature=0))
    out = eng.scheduler.schedule()
    batch = eng.runner.prepare(out)
    cuda = batch.input_ids.is_cuda
    if cuda:
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    logits = eng.runner.forward(batch)
    host = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
    if cuda:
        e1.record()
        torch.cuda.synchronize()
    gpu = e0.elapsed_time(e1) / 1e3 if cuda else None
    wall = time.perf_counter() - t0
    result = eng.runner.sample(batch, logits, eng.structured.grammars)
    eng.output_processor.process(out, eng.scheduler.update(out, result), result)
    eng.abort(rid)                         # finished by its length already: a no-op then
    while eng.has_unfinished():
        eng.step()
    return dict(host_s=host, gpu_s=gpu, wall_s=wall, tokens=batch.input_ids.shape[0],
                graph=batch.graph_batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3", help="qwen3, llama8b or tiny (CPU check)")
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens of the eager step")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from toolkit import LLM

    tiny = args.shape == "tiny"
    settings = (dict(device="cpu", dtype="float32", num_blocks=512, max_num_batched_tokens=4096,
                     max_model_len=4096) if tiny else
                dict(dtype="bfloat16", max_num_batched_tokens=16384, max_model_len=16384,
                     gpu_memory_utilization=0.5))
    llm = LLM(model_config(args.shape), max_num_seqs=64, enable_prefix_caching=False,
              async_scheduling=False, **settings)     # the step's parts are driven by hand
    print(f"engine built; graphs up to {llm.engine.runner.graph_tokens} tokens", flush=True)
    rng = random.Random(0)
    for _ in range(2):                     # first use of this shape: compiles
        one_prefill(llm, args.prompt, rng)
    runs = [one_prefill(llm, args.prompt, rng) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None
           for k in ("host_s", "gpu_s", "wall_s")}
    print(f"{args.shape} prefill of {args.prompt} tokens (graph bucket: {runs[0]['graph']}): "
          f"host issues the forward in {med['host_s'] * 1e3:.2f} ms, GPU "
          + (f"{med['gpu_s'] * 1e3:.2f} ms" if med["gpu_s"] is not None else "n/a")
          + f", forward to sync {med['wall_s'] * 1e3:.2f} ms (medians of {args.repeats})", flush=True)
    prof = cProfile.Profile()
    for _ in range(3):
        one_prefill(llm, args.prompt, rng, prof)
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)   # last: a cut log keeps its top rows
    if args.out:                                        # whole, beside the JSON
        with open(os.path.splitext(args.out)[0] + "_profile.txt", "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(args.top)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(shape=args.shape, prompt=args.prompt, runs=runs, median=med,
                           date=time.strftime("%Y-%m-%d")), f, indent=1)


if __name__ == "__main__":
    main()
