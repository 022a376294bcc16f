"""Activation quantization fused with the norm / SiLU before a W8A8 layer, against the unfused
pair, at the Llama-3.1-8B shapes (hidden 4096, intermediate 14336), on the GPU.

For M = 1 .. 4096 tokens and fp8 / int8 codes, each variant once per layer of its own inputs
(32 layers, nothing stays in L2), the stack replayed from one CUDA graph, median per layer:

    norm    rms_norm(x, w, eps, residual) + per_token_quant    against   rms_norm_dynamic_per_token_quant
    silu    silu_and_mul(gate_up) + per_token_quant            against   silu_and_mul_per_token_quant

with each one's floor (the bytes it must move over the copy bandwidth): the fused norm reads x
and the residual and writes the residual and the codes, the unfused pair also writes the dense
output and reads it back; the fused SiLU reads gate|up once from memory (its rows are wider
than fused_quant.MAX_ONE_BLOCK at TP=1, so its second pass re-reads the row from L2).

    python -m benchmarks quant_fusion [--batches 1,16,64,256,1024,4096] [--layers 32] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from benchmarks.gemm_blas import graph_us

HIDDEN, INTERMEDIATE = 4096, 14336


def _variants(m: int, dtype: torch.dtype, layers: int) -> dict[str, Callable[[], None]]:
    from toolkit.kernels.fused_quant import rms_norm_dynamic_per_token_quant, silu_and_mul_per_token_quant
    from toolkit.kernels.quant_act import per_token_quant
    from toolkit.kernels.rms_norm import rms_norm
    from toolkit.kernels.silu_and_mul import silu_and_mul

    bf = dict(device="cuda", dtype=torch.bfloat16)
    xs = [(torch.randn(m, HIDDEN, **bf), torch.randn(m, HIDDEN, **bf)) for _ in range(layers)]
    w = torch.rand(HIDDEN, **bf) + 0.5
    gus = [torch.randn(m, 2 * INTERMEDIATE, **bf) for _ in range(layers)]
    outs: list = []

    def norm_unfused() -> None:
        outs[:] = [per_token_quant(rms_norm(x, w, 1e-5, r)[0], dtype) for x, r in xs]

    def norm_fused() -> None:
        outs[:] = [rms_norm_dynamic_per_token_quant(x, w, 1e-5, dtype, r) for x, r in xs]

    def silu_unfused() -> None:
        outs[:] = [per_token_quant(silu_and_mul(g), dtype) for g in gus]

    def silu_fused() -> None:
        outs[:] = [silu_and_mul_per_token_quant(g, dtype) for g in gus]

    return {"norm unfused": norm_unfused, "norm fused": norm_fused,
            "silu unfused": silu_unfused, "silu fused": silu_fused}


def floor_us(name: str, m: int, copy_bw: float) -> float:
    """Bytes moved / copy bandwidth: bf16 activations (2 B), 1-byte codes, 4-byte scales."""
    if name.startswith("norm"):
        dense = m * HIDDEN * 2
        bytes_ = 3 * dense + m * HIDDEN + (2 * dense if name.endswith("unfused") else 0)
    else:
        bytes_ = m * 2 * INTERMEDIATE * 2 + m * INTERMEDIATE + (2 * m * INTERMEDIATE * 2 if name.endswith("unfused") else 0)
    return (bytes_ + 4 * m) / copy_bw * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64,256,1024,4096")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--copy-bw", type=float, default=4.2e12, help="bytes/s (the H200's measured copy)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("quant_fusion times CUDA kernels: it needs a GPU")
    rows = []
    for dtype in (torch.float8_e4m3fn, torch.int8):
        for m in [int(b) for b in args.batches.split(",")]:
            row: dict = dict(codes=str(dtype).removeprefix("torch."), batch=m)
            for name, run in _variants(m, dtype, args.layers).items():
                row[name] = graph_us(run, args.layers, args.reps)
                row[f"{name} floor"] = floor_us(name, m, args.copy_bw)
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"{row['codes']:14s} M={m:<5d} " + " | ".join(
                f"{op} {row[op + ' unfused']:6.2f} -> {row[op + ' fused']:6.2f} us "
                f"({row[op + ' unfused'] / row[op + ' fused']:.2f}x, {100 * row[op + ' fused floor'] / row[op + ' fused']:3.0f}% of floor)"
                for op in ("norm", "silu")), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": "llama8b", "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
