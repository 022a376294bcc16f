"""The steady decode step with quantized weights against bf16, same process, Llama-3.1-8B shape.

For each scheme an `LLM` is built on random weights (bf16; load-time fp8, per-channel weights and
dynamic per-token activations, as `quantization="fp8"`; or a random checkpoint in a quantized
layout, `load_format="dummy"` with the config's `quantization_config`), then the mean wall time
of `engine.step()` over decode steps at batch B with 512-token contexts
(`simulator.calibrate.profile_engine`, replayed CUDA graphs), and the ratio bf16 / scheme.
Decode at batch <= 64 reads every weight each step, so fp8's bound is about 2x and 4-bit's 4x
less the attention and the LM head (not quantized).

    python -m benchmarks quant_decode [--schemes bf16,fp8,ct_w4a16] [--batches 1,16,64]
    python -m benchmarks quant_decode --schemes bf16,fp8,fp8+skinny     # W8A8 decode rows through
                                    # the split-K kernel (quant_w8a8.SKINNY_MAX_M = 64 for that build)
    python -m benchmarks quant_decode --tiny        # CPU check of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch


def build(scheme: str, tiny: bool):
    from toolkit import LLM
    from toolkit.models.quantization.export import scheme_config
    from toolkit.models.shapes import llama31_8b

    if tiny:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=256, vocab_size=512, max_position_embeddings=2048)
    else:
        cfg = llama31_8b()
    if scheme not in ("bf16", "fp8"):
        cfg.quantization_config = scheme_config(scheme, 128 if not tiny else 32, (128, 128) if not tiny else (32, 32))
    gpu = torch.cuda.is_available()
    kw = dict(dtype="bfloat16", gpu_memory_utilization=0.5) if gpu else dict(dtype="float32", device="cpu")
    return LLM(cfg, max_num_seqs=64, max_num_batched_tokens=8192, enable_prefix_caching=False,
               max_model_len=2048, quantization="fp8" if scheme == "fp8" else None, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemes", default="bf16,fp8,ct_w4a16",
                    help="bf16, fp8 (load-time), or an export.SCHEME_NAMES layout (random codes)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU (checks the script)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from toolkit.simulator.calibrate import profile_engine

    batches = [int(b) for b in a.batches.split(",")]
    context = 64 if a.tiny else a.context
    rows = []
    from toolkit.kernels import quant_w8a8

    default_skinny = quant_w8a8.SKINNY_MAX_M
    for scheme in a.schemes.split(","):
        layout, _, variant = scheme.partition("+")
        if variant not in ("", "skinny"):
            raise SystemExit(f"unknown variant {variant!r} in {scheme!r}: a scheme or scheme+skinny")
        # read when the graphs are captured, so it holds for this build's steps
        quant_w8a8.SKINNY_MAX_M = 64 if variant == "skinny" else default_skinny
        t = time.perf_counter()
        llm = build(layout, a.tiny)
        built = time.perf_counter() - t
        for b in batches:
            ((_, seconds),) = profile_engine(llm, decode=[(b, context)], steps=4 if a.tiny else a.steps, warmup=3)
            rows.append(dict(scheme=scheme, batch=b, context=context, step_ms=seconds * 1e3, build_s=built))
            print(f"  {scheme:16s} B={b:<3d} decode step {seconds * 1e3:8.3f} ms", flush=True)
        llm.close()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    quant_w8a8.SKINNY_MAX_M = default_skinny
    base = {r["batch"]: r["step_ms"] for r in rows if r["scheme"] == "bf16"}
    for r in rows:
        if r["batch"] in base:
            r["speedup_vs_bf16"] = base[r["batch"]] / r["step_ms"]
    print(f"{'scheme':16s} {'B':>4s} {'step ms':>9s} {'x bf16':>7s}")
    for r in rows:
        print(f"{r['scheme']:16s} {r['batch']:4d} {r['step_ms']:9.3f} {r.get('speedup_vs_bf16', float('nan')):7.2f}")
    result = dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                  date=time.strftime("%Y-%m-%d"), shape="tiny" if a.tiny else "llama31-8b", rows=rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
