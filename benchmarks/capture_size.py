"""Steps larger than the decode batch: eager, or replayed from CUDA graphs captured up to
`EngineConfig.max_cudagraph_capture_size` (#16).

One process; the shape (random weights, the simulator's engine settings: max_num_seqs 128)
is built once per setting, and step shapes past 128 tokens are timed on each with
`toolkit.simulator.calibrate.profile_engine` (mean wall time of a step, after warm-up steps):
prompt chunks of 128-1024 tokens alone, and prompts admitted beside a running decode batch
(what an arrival does to the inter-token latency of everyone running). Size 128 is the
decode batch (the default before 2026-12-02: the run in benchmarks/RESULTS.md, made with
`--sizes none,512`, measured exactly this), 512 today's default.

    python -m benchmarks capture_size --shape llama8b --sizes 128,512
    python -m benchmarks capture_size --shape llama8b --sizes 512,1024   # graphs past 512 (#18's next A/B)
    python -m benchmarks capture_size --shape tiny      # CPU check of the script (no graphs there)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_common import GPU_ENGINE, TINY_ENGINE, model_config, release_llm, tiny_config  # noqa: E402

PREFILL = [128, 192, 256, 384, 512, 1024]
# (decodes, context, prompt); the last two: an arrival's first chunk past 512 tokens beside the
# ~40 decodes of a 0.5x-saturation run (RESULTS, simulator (m): graphs to 1024 took its eager steps)
MIXED = [(32, 512, 128), (32, 512, 256), (96, 512, 256), (64, 512, 448), (40, 512, 640), (40, 512, 960)]
TINY_PREFILL = [32, 64, 128]
TINY_MIXED = [(8, 64, 32), (8, 64, 96)]


def measure(shape: str, size: int | None, steps: int) -> dict:

    from toolkit import LLM
    from toolkit.simulator.calibrate import profile_engine

    tiny = shape == "tiny"
    settings = dict(TINY_ENGINE if tiny else GPU_ENGINE)
    t = time.perf_counter()
    llm = LLM(tiny_config() if tiny else model_config(shape), max_cudagraph_capture_size=size, **settings)
    build_s = time.perf_counter() - t
    runner = llm.engine.runner
    prefill, mixed = (TINY_PREFILL, TINY_MIXED) if tiny else (PREFILL, MIXED)
    samples = profile_engine(llm, prefill=prefill, mixed=mixed, steps=steps, warmup=2)
    names = [f"prefill P={p}" for p in prefill] + [f"{b} decodes (L={c}) + P={p}" for b, c, p in mixed]
    import torch

    # what a larger capture costs: the process's reserved device memory once built (weights,
    # KV cache, graph pools and static tables) and the KV blocks it left
    mem = torch.cuda.memory_reserved() / 2**30 if torch.cuda.is_available() else None
    row = dict(size=size, graph_tokens=runner.graph_tokens, build_s=build_s, reserved_gib=mem,
               num_blocks=llm.engine.scheduler.allocator.num_blocks, startup=dict(llm.engine.startup),
               steps={n: y for n, (_, y) in zip(names, samples)})
    release_llm(llm)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b", help="llama8b, qwen3 or tiny (CPU check)")
    ap.add_argument("--sizes", default="128,512", help="comma list of max_cudagraph_capture_size values "
                                                      "('none': the default rule)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per shape")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [None if s.strip().lower() == "none" else int(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        row = measure(args.shape, size, args.steps)
        rows.append(row)
        print(f"max_cudagraph_capture_size={size}: graphs up to {row['graph_tokens']} tokens, "
              f"built in {row['build_s']:.1f} s, {row['num_blocks']} KV blocks"
              + (f", {row['reserved_gib']:.2f} GiB reserved" if row["reserved_gib"] is not None else ""), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(date=time.strftime("%Y-%m-%d"), shape=args.shape, rows=rows), f, indent=1)
    print("\nstep".ljust(34) + "".join(f"{str(r['size']):>12s}" for r in rows) + "   (ms per step, by capture limit)")
    for name in rows[0]["steps"]:
        cells = [r["steps"][name] * 1e3 for r in rows]
        ratio = f"   {cells[0] / cells[-1]:.2f}x" if len(cells) > 1 else ""
        print(f"{name:33s}" + "".join(f"{c:12.2f}" for c in cells) + ratio)


if __name__ == "__main__":
    main()
