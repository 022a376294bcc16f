"""A decode step's projections, cuBLAS against cuBLASLt, against their bandwidth floor.

At batch 256 the Qwen3-0.6B decode step spends 0.92 ms in its 113 GEMMs against a floor of
0.40 ms (RESULTS, "A decode step against its roofline" (g)): each GEMM reads 2-13 MB of
weights, 0.5-3 us at the copy bandwidth, and runs several times that. This times the
model's four projection shapes per layer the way a step runs them (floor: max(bytes / copy
bandwidth, FLOPs / matmul peak)): every layer its own
weights (nothing stays in L2), all layers in one CUDA graph, per GEMM; once with torch's
default BLAS library, once with cuBLASLt (`torch.backends.cuda.preferred_blas_library`), and
once with the split-K kernel for few rows (`toolkit/kernels/skinny_gemm.py`, in commit 501e6f2
with its tiling sweep `benchmarks/skinny_sweep.py`: 0.65-1.22x cuBLAS, not on main) when the
checkout has it.

    python -m benchmarks gemm_blas --shape qwen3 --batches 16,64,128,256
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

SHAPES = {   # (hidden, heads x head_dim, KV heads x head_dim, intermediate, layers)
    "qwen3": (1024, 2048, 1024, 3072, 28),
    "llama8b": (4096, 4096, 1024, 14336, 32),
}


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(n_in, n_out) of each projection of a layer."""
    h, q, kv, i, _ = SHAPES[shape]
    return {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * i), "down": (i, h)}


def time_layers(m: int, n_in: int, n_out: int, layers: int, reps: int = 20, op=F.linear) -> float:
    """Median us of one [m, n_in] x [n_in, n_out] GEMM, `layers` of them (own weights) in one graph."""
    ws = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    x = torch.randn(m, n_in, device="cuda", dtype=torch.bfloat16)
    outs = []

    def run() -> None:                 # F.linear, as the model's Linear calls it
        outs[:] = [op(x, w) for w in ws]

    return graph_us(run, layers, reps)


def graph_us(run, layers: int, reps: int) -> float:
    """Median us per layer of `run` (which runs `layers` ops) replayed from one CUDA graph."""
    run()
    torch.cuda.synchronize()
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
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
        times.append(a.elapsed_time(b) * 1e3 / layers)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3")
    ap.add_argument("--batches", default="16,64,128,256")
    ap.add_argument("--copy-bw", type=float, default=4.2e12, help="bytes/s (the H200's measured copy)")
    ap.add_argument("--matmul-flops", type=float, default=790e12, help="FLOP/s (the H200's measured bf16 matmul)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    layers = SHAPES[args.shape][-1]
    libs = ["default", "cublaslt"]
    try:                              # the toolkit's split-K kernel for few rows, at every size here
        from toolkit.kernels.skinny_gemm import SkinnyLinear

        skinny = SkinnyLinear(max_rows=1 << 30)
        libs.append("skinny")
    except ImportError:               # an older checkout
        skinny = None
    rows = []
    for m in [int(b) for b in args.batches.split(",")]:
        for name, (n_in, n_out) in projections(args.shape).items():
            floor_us = max((n_in * n_out + m * (n_in + n_out)) * 2 / args.copy_bw,
                           2 * m * n_in * n_out / args.matmul_flops) * 1e6
            row = dict(batch=m, proj=name, n_in=n_in, n_out=n_out, floor_us=floor_us)
            for lib in libs:
                before = torch.backends.cuda.preferred_blas_library()
                if lib == "cublaslt":
                    torch.backends.cuda.preferred_blas_library(lib)
                try:
                    row[lib] = time_layers(m, n_in, n_out, layers, op=skinny if lib == "skinny" else F.linear)
                finally:
                    torch.backends.cuda.preferred_blas_library(before)
            rows.append(row)
            print(f"b{m:<4d} {name:8s} {n_in:>6d}x{n_out:<6d} floor {floor_us:6.2f} us | "
                  + " | ".join(f"{lib} {row[lib]:6.2f} us ({floor_us / row[lib] * 100:4.0f}%)" for lib in libs),
                  flush=True)
        tot = {lib: sum(r[lib] for r in rows if r["batch"] == m) * layers / 1e3 for lib in libs}
        fl = sum(r["floor_us"] for r in rows if r["batch"] == m) * layers / 1e3
        print(f"b{m}: a step's projections {' / '.join(f'{lib} {v:.3f} ms' for lib, v in tot.items())}, "
              f"floor {fl:.3f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
