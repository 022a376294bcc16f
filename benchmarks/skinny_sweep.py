"""The split-K GEMM's tiles swept per projection shape and row count, against cuBLAS.

For each of a model's four projection shapes and each row count, every candidate tiling of
`toolkit/kernels/skinny_gemm.py` (orientation, BLOCK_N, BLOCK_K, warps, stages, split target)
is timed the way a step runs it (`gemm_blas.time_layers`: every layer its own weights, all
layers in one CUDA graph, median per GEMM) beside F.linear (cuBLAS) in the same process, and
checked against F.linear in float32. Candidates compile first in a pool of processes (Triton's
on-disk cache), so the sweep is not one compile after another.

    python benchmarks/skinny_sweep.py --shape qwen3 --rows 16,32,64,128,256 --out sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.gemm_blas import SHAPES, projections  # noqa: E402
from toolkit.kernels.skinny_gemm import SkinnyConfig, SkinnyLinear, make_config  # noqa: E402


def candidates(m: int, n: int, k: int, sms: int) -> list[SkinnyConfig]:
    out = []
    if m <= 64:           # swapped: the weights are the MMA's 64/128-row operand
        for bn, bk, st, prog in itertools.product((64, 128), (64, 128, 256), (3, 4, 5), (1, 2, 4)):
            if (bn + 64) * bk * 2 * st > 200_000:          # shared memory per program
                continue
            out.append(make_config(m, n, k, block_n=bn, block_k=bk, programs=prog * sms, num_warps=4,
                                   num_stages=st, swap=True))
    if m >= 64:
        for bm, bn, bk, w, st, prog in itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (3, 4), (1, 2)):
            if bm > max(64, m) or (bm + bn) * bk * 2 * st > 200_000:
                continue
            out.append(make_config(m, n, k, block_m=bm, block_n=bn, block_k=bk, programs=prog * sms,
                                   num_warps=w, num_stages=st, swap=False))
    return list(dict.fromkeys(out))


def _compile_one(task: tuple[int, int, int, SkinnyConfig]) -> str:
    m, n, k, cfg = task
    try:
        x = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.zeros(n, k, device="cuda", dtype=torch.bfloat16)
        SkinnyLinear().gemm(x, w, cfg)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:                      # noqa: BLE001 (out of shared memory etc.)
        return f"{type(e).__name__}: {str(e)[:120]}"


def precompile(tasks: list[tuple[int, int, int, SkinnyConfig]], workers: int) -> dict:
    """Compile every distinct kernel once, in parallel processes (Triton's disk cache keeps them)."""
    keyed = {}
    for m, n, k, c in tasks:
        key = (c.block_m, c.block_n, c.block_k, c.split > 1, c.split % 16 == 0, c.swap, c.num_warps,
               c.num_stages, k % c.block_k == 0)
        keyed.setdefault(key, (m, n, k, c))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map(_compile_one, list(keyed.values()))
    bad = sum(r != "ok" for r in res)
    print(f"precompiled {len(keyed)} kernels in {time.perf_counter() - t0:.1f} s ({bad} failed)", flush=True)
    return dict(zip(keyed, res))


def time_graph(run, reps: int = 15) -> float:
    """Median ms of one replay of `run` captured in a CUDA graph."""
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        run()
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del g
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3")
    ap.add_argument("--rows", default="16,32,64,128,256")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--budget", type=float, default=300, help="seconds for the timing part")
    ap.add_argument("--copy-bw", type=float, default=4.2e12)
    ap.add_argument("--matmul-flops", type=float, default=790e12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layers = SHAPES[args.shape][-1]
    rows_list = [int(r) for r in args.rows.split(",")]
    shapes = projections(args.shape)
    tasks = [(m, n_out, n_in, c) for m in rows_list for n_in, n_out in shapes.values()
             for c in candidates(m, n_out, n_in, sms)]
    status = precompile(tasks, args.workers)
    lin = SkinnyLinear(max_rows=1 << 30)
    t_end = time.perf_counter() + args.budget
    results = []
    for m in rows_list:
        step = {"cublas": 0.0, "best": 0.0, "floor": 0.0}
        for name, (n_in, n_out) in shapes.items():
            ws = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
            x = torch.randn(m, n_in, device="cuda", dtype=torch.bfloat16)
            want = F.linear(x.float(), ws[0].float())
            floor_us = max((n_in * n_out + m * (n_in + n_out)) * 2 / args.copy_bw,
                           2 * m * n_in * n_out / args.matmul_flops) * 1e6
            cublas = time_graph(lambda: [F.linear(x, w) for w in ws]) * 1e3 / layers
            timed = []
            for c in candidates(m, n_out, n_in, sms):
                if time.perf_counter() > t_end:
                    break
                try:
                    got = lin.gemm(x, ws[0], c)
                    err = (got.float() - want).abs().max().item()
                    if not err <= 2e-2 * max(1.0, want.abs().max().item()):
                        print(f"  WRONG {c} err {err}", flush=True)
                        continue
                    us = time_graph(lambda c=c: [lin.gemm(x, w, c) for w in ws]) * 1e3 / layers
                except Exception as e:      # noqa: BLE001
                    print(f"  failed {c}: {type(e).__name__}", flush=True)
                    continue
                timed.append((us, c))
            timed.sort(key=lambda t: t[0])
            best_us, best = timed[0] if timed else (float("inf"), None)
            results.append(dict(rows=m, proj=name, n_in=n_in, n_out=n_out, floor_us=floor_us, cublas_us=cublas,
                                best_us=best_us, best=best.__dict__ if best else None,
                                top5=[dict(us=u, **c.__dict__) for u, c in timed[:5]], tried=len(timed)))
            step["cublas"] += cublas
            step["best"] += min(best_us, cublas)
            step["floor"] += floor_us
            print(f"m{m:<4d} {name:8s} {n_in:>5d}x{n_out:<5d} floor {floor_us:5.2f} | cuBLAS {cublas:5.2f} | "
                  f"skinny {best_us:5.2f} us ({cublas / best_us:4.2f}x) of {len(timed)}: {best}", flush=True)
            del ws
        print(f"m{m}: a step's projections cuBLAS {step['cublas'] * layers / 1e3:.3f} ms, best-of "
              f"{step['best'] * layers / 1e3:.3f} ms, floor {step['floor'] * layers / 1e3:.3f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "gpu": torch.cuda.get_device_name(), "sms": sms,
                       "compile": {str(k): v for k, v in status.items()}, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
