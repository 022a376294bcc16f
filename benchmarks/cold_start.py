"""Cold and warm start of `LLM(...)`: the warm-up's kernels compiled one by one against in
parallel (EngineConfig.compile_workers), each start in a new process.

Per shape (random weights at real shapes, bf16), each in its own Python process, so no kernel
is compiled in memory before it:
  cold, in turn     an empty Triton cache (a new TRITON_CACHE_DIR), compile_workers=0
  cold, parallel    an empty Triton cache, compile_workers=--workers
  warm              the parallel run's cache, compile_workers=--workers (the collecting pass
                    runs and finds every compile a cache hit)
Reported: LLM(...)'s seconds (the process's import of torch not counted) and its phases
(load, KV cache, warm-up; of the warm-up: precompile, compiles in turn, captures); and the
kernels that still compiled slowly (> 0.1 s: not a cache hit) after the parallel compile.

    python -m benchmarks cold_start --shapes qwen3,llama8b --workers 16
    python -m benchmarks cold_start --shapes tiny --workers 2     # the CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from benchmarks.sim_common import build_llm
from toolkit import SamplingParams
from toolkit.kernels.compiles import triton_compiles
with triton_compiles(strict=False) as compiled:      # every compile in LLM(...), hits included
    start = time.perf_counter()
    llm = build_llm({shape!r}, compile_workers={workers})
    total = time.perf_counter() - start
out = llm.generate([[11, 12, 13, 14] * 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                   use_tqdm=False)
print("RESULT " + json.dumps(dict(total_s=total, startup=llm.engine.startup, compiled=compiled,
                                  tokens=list(out[0].outputs[0].token_ids))))
"""


def start_once(shape: str, workers: int, cache_dir: str, timeout: float) -> dict:
    """LLM(...) in a new process with TRITON_CACHE_DIR=cache_dir: its seconds and phases."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_CACHE_DIR": cache_dir}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=root, shape=shape, workers=workers)],
                          check=False, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{shape} workers={workers} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    row = json.loads(lines[-1][len("RESULT "):])
    row["process_s"] = wall
    return row


def measure(shape: str, workers: int, timeout: float) -> dict:
    runs = {}
    with tempfile.TemporaryDirectory() as serial_dir, tempfile.TemporaryDirectory() as parallel_dir:
        runs["cold_in_turn"] = start_once(shape, 0, serial_dir, timeout)
        runs["cold_parallel"] = start_once(shape, workers, parallel_dir, timeout)
        runs["warm"] = start_once(shape, workers, parallel_dir, timeout)
    same = runs["cold_in_turn"]["tokens"] == runs["cold_parallel"]["tokens"] == runs["warm"]["tokens"]
    return {"shape": shape, "workers": workers, "cpus": os.cpu_count(), "same_tokens": same, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3,llama8b", help="comma list: qwen3, llama8b, tiny (CPU check)")
    ap.add_argument("--workers", type=int, default=16, help="compile_workers of the parallel runs")
    ap.add_argument("--timeout", type=float, default=240, help="seconds allowed to one start")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        row = measure(shape, args.workers, args.timeout)
        rows.append(row)
        for name, r in row["runs"].items():
            s = r["startup"]
            print(f"{shape} {name:13s} LLM(...) {r['total_s']:6.1f} s: load {s.get('load_s', 0):.1f}, "
                  f"KV {s.get('kv_cache_s', 0):.1f}, warm-up {s.get('warmup_s', 0):.1f} (precompile "
                  f"{s.get('precompile_s', 0):.1f} s: {s.get('precompiled', 0)} kernels compiled, "
                  f"{s.get('precompile_cached', 0)} cached, {s.get('precompile_unseen', 0)} unseen; in turn "
                  f"{s.get('compile_s', 0):.1f} s of {s.get('kernels_compiled', 0)}, capture {s.get('capture_s', 0):.1f})")
        slow = {k: v for k, v in row["runs"]["cold_parallel"]["compiled"].items() if v[1] > 0.1}
        print(f"{shape}: compiled in turn after the parallel compile (> 0.1 s): {slow}")
        print(f"{shape}: same greedy tokens in the three starts: {row['same_tokens']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"workers": args.workers, "shapes": rows}, f, indent=1)


if __name__ == "__main__":
    main()
