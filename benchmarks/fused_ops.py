"""The attention input's small ops, fused against the kernels they replace (#21), on the GPU.

Qwen3 (per-head RMSNorm on q and k, then rotary): `qk_norm_rotary`, one launch, against
rms_norm(q) + rms_norm(k) + rotary(q) + rotary(k), four launches of the previous kernels
(the rotary kernel before it took q and k together: one program per (token, head), kept
below as `_previous_rotary`). Llama (rotary only): one launch against two. Each variant runs
once per layer of the model, the whole stack replayed from one CUDA graph (as a decode step
runs it); median of triton.testing.do_bench (L2 flushed), so the figure is GPU time per step.

Then the LM head's logits: bf16 GEMM + `.float()` (what `compute_logits` does) against one GEMM
with fp32 output.

    python -m benchmarks kernels
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from toolkit.kernels import reference_model as ref
from toolkit.kernels.rms_norm import rms_norm
from toolkit.kernels.rotary import qk_norm_rotary, rotary

SHAPES = {"qwen3-0.6b": (16, 8, 128, 28, True), "llama3-8b": (32, 8, 128, 32, False)}   # H, H_kv, D, layers, qk_norm


@triton.jit
def _previous_rotary_kernel(x_ptr, out_ptr, pos_ptr, cache_ptr, stride_xt, stride_xh, stride_ot, stride_oh,
                            stride_cache, HALF: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=mask, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs, mask=mask, other=0.0)
    x = x_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    o = out_ptr + t * stride_ot + h * stride_oh
    ty = out_ptr.dtype.element_ty
    tl.store(o + offs, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(o + HALF + offs, (x2 * cos + x1 * sin).to(ty), mask=mask)


def _previous_rotary(positions, x, out, cache) -> None:
    t, h, d = x.shape
    _previous_rotary_kernel[(t, h)](x, out, positions, cache, x.stride(0), x.stride(1), out.stride(0),
                                    out.stride(1), cache.stride(0), HALF=d // 2,
                                    BLOCK=triton.next_power_of_2(d // 2))


def graph_us(fn: Callable[[], Any]) -> float:
    """Median GPU time of fn replayed from one CUDA graph, in us (benchmarks/attention.py's timer)."""
    from benchmarks.attention import graph_ms

    return 1e3 * graph_ms(fn)


def one(name: str, tokens: int) -> dict:
    h, h_kv, d, layers, qk_norm = SHAPES[name]
    dev, dt = "cuda", torch.bfloat16
    inv = 1.0 / 1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d)
    f = torch.outer(torch.arange(40960, dtype=torch.float32, device=dev), inv)
    cache = torch.cat((f.cos(), f.sin()), dim=-1)                                  # [P, D]
    positions = torch.randint(0, 4096, (tokens,), device=dev)
    qkvs = [torch.randn(tokens, (h + 2 * h_kv) * d, device=dev, dtype=dt) for _ in range(layers)]
    views = [tuple(x.view(tokens, -1, d) for x in qkv.split([h * d, h_kv * d, h_kv * d], dim=-1))[:2]
             for qkv in qkvs]                                                        # (q, k) [T, heads, D]
    q_w, k_w = torch.rand(d, device=dev, dtype=dt) + 0.5, torch.rand(d, device=dev, dtype=dt) + 0.5
    outs = [(torch.empty(tokens, h, d, device=dev, dtype=dt), torch.empty(tokens, h_kv, d, device=dev, dtype=dt))
            for _ in range(layers)]

    def fused():
        for (q, k), out in zip(views, outs):
            if qk_norm:
                qk_norm_rotary(positions, q, k, cache, q_w, k_w, 1e-6, out=out)
            else:
                rotary(positions, q, k, cache, out=out)

    def previous():
        for (q, k), (qo, ko) in zip(views, outs):
            if qk_norm:
                q, k = rms_norm(q, q_w, 1e-6)[0], rms_norm(k, k_w, 1e-6)[0]
            _previous_rotary(positions, q, qo, cache)
            _previous_rotary(positions, k, ko, cache)

    fused()
    got = [tuple(t.clone() for t in o) for o in outs]
    previous()
    q, k = views[0]
    want = (ref.qk_norm_rotary(positions, q, k, cache, q_w, k_w, 1e-6, out=tuple(torch.empty_like(t) for t in outs[0]))
            if qk_norm else ref.rotary(positions, q, k, cache, out=tuple(torch.empty_like(t) for t in outs[0])))
    same = all(torch.equal(a, b) for g, o in zip(got, outs) for a, b in zip(g, o))
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got[0], want))
    t_fused, t_prev = graph_us(fused), graph_us(previous)
    row = {"model": name, "tokens": tokens, "layers": layers, "qk_norm": qk_norm,
           "launches_fused": layers, "launches_previous": layers * (4 if qk_norm else 2),
           "fused_us": t_fused, "previous_us": t_prev, "saved_us": t_prev - t_fused,
           "bitwise_equal_to_previous": same, "max_err_vs_twin": err}
    print(f"{name:11s} T={tokens:5d}  fused {t_fused:7.1f} us ({row['launches_fused']} launches)  previous "
          f"{t_prev:7.1f} us ({row['launches_previous']})  saved {t_prev - t_fused:6.1f} us a step  "
          f"({t_prev / t_fused:.2f}x)  bitwise equal {same}  err vs twin {err:.1e}", flush=True)
    return row


LM_HEADS = {"qwen3-0.6b": (1024, 151936), "llama3-8b": (4096, 128256)}   # hidden, vocab


def lm_head(name: str, tokens: int) -> dict:
    """The logits as compute_logits makes them, F.linear in bf16 then .float() (a GEMM and a
    conversion kernel: the bf16 logits written, read, written again in fp32), against one
    GEMM with fp32 output, torch.mm(h, W.t(), torch.float32) (CUDA, torch >= 2.8). A lead
    from the roofline's "other" kind, timed before any engine change."""
    import torch.nn.functional as F

    hidden, vocab = LM_HEADS[name]
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5
    row = {"lm_head": name, "tokens": tokens}
    want = h.float() @ w.float().t()
    try:
        got = torch.mm(h, w.t(), torch.float32)
    except (TypeError, RuntimeError) as e:      # a torch without the out_dtype overload
        row["fp32_out"] = f"unsupported: {e}"[:200]
        got = None
    row["bf16_then_float_us"] = graph_us(lambda: F.linear(h, w).float())
    two_step_err = float((F.linear(h, w).float() - want).abs().max())
    if got is not None:
        row["fp32_out_us"] = graph_us(lambda: torch.mm(h, w.t(), torch.float32))
        row["fp32_out_err"], row["bf16_then_float_err"] = float((got - want).abs().max()), two_step_err
    print(f"LM head {name:11s} T={tokens:5d}  bf16 + .float() {row['bf16_then_float_us']:7.1f} us  "
          + (f"fp32 out {row['fp32_out_us']:7.1f} us ({row['bf16_then_float_us'] / row['fp32_out_us']:.2f}x), "
             f"max err vs fp32 {row['fp32_out_err']:.1e} (two-step {two_step_err:.1e})" if got is not None
             else row["fp32_out"]), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "fused_ops.json"))
    ap.add_argument("--tokens", default="1,8,64,256,2048")
    args = ap.parse_args()
    start = time.time()
    rows = [one(name, t) for name in SHAPES for t in map(int, args.tokens.split(","))]
    heads = [lm_head(name, t) for name in LM_HEADS for t in (8, 256)]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows, "lm_head": heads, "wall_s": time.time() - start}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
