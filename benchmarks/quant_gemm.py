"""Quantized GEMMs at the Llama-3.1-8B projection shapes against cuBLAS bf16 and their rooflines.

For M = 1 .. 4096 rows and each projection (qkv 4096x6144, o 4096x4096, gate_up 4096x28672,
down 14336x4096), every layer its own weights (nothing stays in L2), all 32 layers in one CUDA
graph, per GEMM, median of the replays:

    bf16        F.linear (cuBLAS), the peer
    fp8         dynamic per-token activation quantization (Triton) + quant_w8a8.scaled_mm: the
                split-K Triton kernel at M <= SKINNY_MAX_M (quant_w8a8_skinny), else
                torch._scaled_mm (cuBLASLt, row-wise scales); "fp8 gemm" is that GEMM alone,
                "fp8 lt" cuBLASLt's alone and "fp8 skinny" the split-K kernel's alone, at every M
    int8        the same quantization + the same Triton kernel at M <= SKINNY_MAX_M, else
                torch._int_mm and the fp32 scale epilogue; "int8 skinny": the split-K kernel alone
    w4a16       the Triton W4A16 kernel (group 128, zero points), dequantizing in its inner loop
    fp8 block   the Triton grouped-W8 kernel (128 x 128 block scales, activations unquantized)
    fp8 w8a16   the same kernel on per-channel fp8 weights (one group of K), bf16 activations

Floor of each: max(bytes it must move / copy bandwidth, FLOPs / peak), with the weight bytes of
its format (2, 1, 1, 0.5 + scales) and the fp8 / int8 peak twice the bf16 one.

    python -m benchmarks quant_gemm [--batches 1,16,64,256,1024,4096] [--layers 32]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.gemm_blas import graph_us, projections

W8A8 = ("fp8", "fp8 gemm", "fp8 lt", "fp8 skinny", "int8", "int8 skinny")   # 8-bit codes into the GEMM
SCHEMES = ("bf16", *W8A8, "w4a16", "fp8 block", "fp8 w8a16")


def _ops(scheme: str, m: int, n_in: int, n_out: int, layers: int) -> Callable[[], None]:
    """One call running the scheme's GEMM over `layers` weights of its own format."""
    from toolkit.kernels import reference_quant as ref
    from toolkit.kernels.quant_act import per_token_quant
    from toolkit.kernels.quant_w4a16 import grouped_w8a16_gemm, w4a16_gemm
    from toolkit.kernels.quant_w8a8 import scaled_mm
    from toolkit.kernels.quant_w8a8_skinny import scaled_mm_skinny

    x = torch.randn(m, n_in, device="cuda", dtype=torch.bfloat16)
    dense = lambda: torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) * 0.02
    outs: list = []
    if scheme == "bf16":
        ws = [dense() for _ in range(layers)]
        return lambda: outs.__setitem__(slice(None), [F.linear(x, w) for w in ws])
    if scheme in W8A8:
        dtype = torch.int8 if scheme.startswith("int8") else ref.FP8
        ws = [per_token_quant(dense(), dtype) for _ in range(layers)]
        qx, sx = per_token_quant(x, dtype)
        if scheme.endswith("skinny"):    # the split-K kernel at every M, the GEMM alone
            return lambda: outs.__setitem__(slice(None), [scaled_mm_skinny(
                qx, sx, w, s.reshape(-1), None, torch.bfloat16) for w, s in ws])
        if scheme == "fp8 lt":           # cuBLASLt at every M (scaled_mm may take the Triton kernel)
            return lambda: outs.__setitem__(slice(None), [torch._scaled_mm(
                qx, w.t(), scale_a=sx, scale_b=s.reshape(1, -1), out_dtype=torch.bfloat16) for w, s in ws])
        if scheme == "fp8 gemm":
            return lambda: outs.__setitem__(slice(None), [scaled_mm(qx, sx, w, s.reshape(-1), None, torch.bfloat16)
                                                          for w, s in ws])

        def run() -> None:
            outs[:] = []
            for w, s in ws:
                q, sa = per_token_quant(x, dtype)
                outs.append(scaled_mm(q, sa, w, s.reshape(-1), None, torch.bfloat16))
        return run
    groups = -(-n_in // 128)
    if scheme == "w4a16":
        ws = [(torch.randint(-2**31, 2**31 - 1, (n_out, n_in // 8), device="cuda", dtype=torch.int32),
               torch.rand(n_out, groups, device="cuda") * 1e-3,
               torch.randint(0, 16, (n_out, groups), device="cuda", dtype=torch.uint8)) for _ in range(layers)]
        return lambda: outs.__setitem__(slice(None), [w4a16_gemm(x, q, s, z, 128) for q, s, z in ws])
    if scheme == "fp8 w8a16":          # per-channel fp8 weights, bf16 activations: one group of n_in
        ws = [per_token_quant(dense(), ref.FP8) for _ in range(layers)]
        return lambda: outs.__setitem__(slice(None), [grouped_w8a16_gemm(x, w, s, n_in) for w, s in ws])
    ws = [(dense().to(ref.FP8), torch.rand(n_out, groups, device="cuda") * 1e-3) for _ in range(layers)]
    return lambda: outs.__setitem__(slice(None), [grouped_w8a16_gemm(x, w, s, 128) for w, s in ws])


def floor_us(scheme: str, m: int, n_in: int, n_out: int, copy_bw: float, bf16_flops: float) -> float:
    w_bytes = {"bf16": 2.0, "w4a16": 0.5 + 4 * 2 / 128}.get(scheme, 1.0 + (4 / 128**2 if scheme == "fp8 block" else 0))
    a_bytes = 2 if scheme in ("bf16", "w4a16", "fp8 block", "fp8 w8a16") else 3     # bf16 in (+ 1-byte codes), bf16 out
    bytes_ = n_in * n_out * w_bytes + m * (n_in * a_bytes + n_out * 2)
    peak = bf16_flops * (2 if scheme in W8A8 else 1)
    return max(bytes_ / copy_bw, 2 * m * n_in * n_out / peak) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64,256,1024,4096")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--copy-bw", type=float, default=4.2e12, help="bytes/s (the H200's measured copy)")
    ap.add_argument("--matmul-flops", type=float, default=790e12, help="FLOP/s (the H200's measured bf16 matmul)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("quant_gemm times CUDA kernels: it needs a GPU")
    schemes = [s for s in args.schemes.split(",") if s]
    rows = []
    for m in [int(b) for b in args.batches.split(",")]:
        for proj, (n_in, n_out) in projections("llama8b").items():
            row = dict(batch=m, proj=proj, n_in=n_in, n_out=n_out)
            for scheme in schemes:
                row[scheme] = graph_us(_ops(scheme, m, n_in, n_out, args.layers), args.layers, args.reps)
                row[f"{scheme} floor"] = floor_us(scheme, m, n_in, n_out, args.copy_bw, args.matmul_flops)
                torch.cuda.empty_cache()
            rows.append(row)
            print(f"M={m:<5d} {proj:8s} " + " | ".join(
                f"{s} {row[s]:7.2f} us ({row['bf16'] / row[s]:.2f}x bf16, {100 * row[s + ' floor'] / row[s]:3.0f}% of floor)"
                if "bf16" in row else f"{s} {row[s]:7.2f} us" for s in schemes), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": "llama8b", "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
