"""Mixture-of-experts on the H200 (#44): the MoE layer's kernels, the decode step and ShareGPT
throughput at the Qwen3-30B-A3B shape (random bf16 weights; it fits one H200).

kernel    the experts of one MoE layer (128 experts, top-8, hidden 2048, expert intermediate 768)
          for 1-512 tokens: the Triton fused kernel (`toolkit/kernels/fused_moe.py`) against the
          per-expert loop (`moe_torch.fused_experts`: sorted, one pair of matmuls an expert) and
          torch's grouped GEMM (`torch._grouped_mm`, sync-free: tokens sorted by expert, the
          group offsets a cumulative count on the device). Each is checked against the twin
          first. The fused kernel and grouped GEMM are timed replayed from a CUDA graph (the
          loop reads the experts' counts on the host: timed eagerly). Figure: the share of the
          layer's roofline, max(bytes / copy bandwidth, FLOPs / matmul peak) with the bytes the
          weights of the experts the tokens selected (each read once) and the tokens in and
          out, and the FLOPs those of the active parameters (2 x T x k x 3 x D x I).
decode    the engine's steady decode step at batch 1, 16 and 256 (512-token contexts), the mean
          wall time of engine.step() (`simulator.calibrate.profile_engine`), against the step's
          roofline: `benchmarks/roofline.py`'s dense ops with the MLP replaced by the router and
          the experts a batch of B touches, E * (1 - (1 - k / E)^B) (`simulator.cost`).
sharegpt  ShareGPT-N output tok/s of LLM.generate against Hugging Face continuous batching on
          the first --hf-num requests (`benchmarks/throughput.py`'s two runners, same process).

`--toy`: a 2-layer Qwen3-MoE of hidden 64 (32 experts, top-4) on the CPU, a random workload
and HF `generate` for the last part: the benchmark's path end to end, for a CPU test; its
figures say nothing about the H200.

    python -m benchmarks moe                               # the H200: all three parts
    python -m benchmarks moe --parts kernel --tokens 1,8,64,512
    python -m benchmarks moe --toy                         # the CPU check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

SHAPE = "qwen3-30b-a3b"


def grouped_mm_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor) -> torch.Tensor:
    """The experts through torch._grouped_mm (moe_torch.fused_experts' signature): the T*k
    assignments sorted by expert, one grouped GEMM for gate_up and one for down, the offsets
    a cumulative count on the device (no host sync). Strides must be multiples of 16 bytes."""
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1)                                                 # [T*k]
    order = torch.argsort(flat, stable=True)
    xs = x.index_select(0, order // k)                                          # [T*k, D] by expert
    # per-expert counts by scatter_add (CUDA's bincount reads the max on the host)
    counts = torch.zeros(w13.shape[0], dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))                      # [E]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)                           # [E] group ends
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)                  # [T*k, 2I]
    gate, up = h.chunk(2, dim=-1)
    ys = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)   # [T*k, D]
    y = torch.empty_like(ys).index_copy_(0, order, ys)                          # [T*k, D] un-sorted
    return (y.view(t, k, -1) * topk_weights.to(y.dtype).view(t, k, 1)).sum(dim=1)


# ---------------------------------------------------------------- timing and peaks

def time_ms(fn: Callable[[], Any], graph: bool) -> float:
    """Median milliseconds of fn: on CUDA replayed from a CUDA graph (graph=True, L2 flushed:
    benchmarks/attention.py) or by triton's do_bench; on the CPU the median wall time."""
    if torch.cuda.is_available():
        if graph:
            from benchmarks.attention import graph_ms

            return graph_ms(fn)
        import triton

        return triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")
    fn()
    times = []
    for _ in range(7):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def peaks() -> tuple[float, float]:
    """(copy bandwidth bytes/s, matmul FLOP/s): the GPU's measured (roofline.measure_peaks), or
    a CPU's from a 64 MiB copy and a 512^3 float32 matmul."""
    if torch.cuda.is_available():
        from benchmarks.roofline import measure_peaks

        return measure_peaks()
    src = torch.empty(64 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    return 2.0 * (64 << 20) / (time_ms(lambda: dst.copy_(src), False) * 1e-3), \
        2.0 * 512 ** 3 / (time_ms(lambda: a @ b, False) * 1e-3)


# ---------------------------------------------------------------- kernel

def layer_case(t: int, e: int, k: int, d: int, i: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, d, device=device, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, d, device=device, generator=g) / d ** 0.5).to(dtype)
    w2 = (torch.randn(e, d, i, device=device, generator=g) / i ** 0.5).to(dtype)
    from toolkit.kernels import moe_torch

    weights, ids = moe_torch.select_experts(torch.randn(t, e, device=device, generator=g), k, True)
    return x, w13, w2, weights, ids


def layer_floor_ms(ids: torch.Tensor, d: int, i: int, nbytes: int, copy_bw: float, matmul: float) -> dict:
    """The layer's roofline: the selected experts' weights once, tokens in and out; the FLOPs
    of the active parameters."""
    t, k = ids.shape
    touched = int(torch.unique(ids).numel())
    moved = touched * 3 * d * i * nbytes + 2 * t * d * nbytes
    flops = 2.0 * t * k * 3 * d * i
    return dict(touched=touched, bytes=moved, flops=flops, floor_ms=1e3 * max(moved / copy_bw, flops / matmul))


def bench_kernel(tokens: list[int], e: int, k: int, d: int, i: int, dtype: torch.dtype, device: str,
                 copy_bw: float, matmul: float) -> list[dict]:
    from toolkit.kernels import moe_torch, reference_moe

    impls: dict[str, tuple[Callable, bool]] = {"loop": (moe_torch.fused_experts, False)}
    if hasattr(torch, "_grouped_mm"):
        impls["grouped_mm"] = (grouped_mm_experts, True)
    if device == "cuda":
        from toolkit.kernels.fused_moe import fused_experts

        impls["fused"] = (fused_experts, True)
    rows = []
    for t in tokens:
        case = layer_case(t, e, k, d, i, dtype, device)
        want = reference_moe.fused_experts(*case).float()
        row = dict(tokens=t, **layer_floor_ms(case[4], d, i, case[0].element_size(), copy_bw, matmul), ms={})
        for name, (fn, graph) in impls.items():
            got = fn(*case).float()
            tol = 2e-2 if dtype != torch.float32 else 1e-4
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
            row["ms"][name] = time_ms(lambda fn=fn, case=case: fn(*case), graph)
        row["share"] = {n: row["floor_ms"] / ms for n, ms in row["ms"].items()}
        print(f"  kernel T={t:<4d} touched {row['touched']:>3d}/{e}  floor {row['floor_ms']:.4f} ms  "
              + "  ".join(f"{n} {ms:.4f} ms ({row['share'][n]:.0%})" for n, ms in row["ms"].items()), flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- decode step

def decode_floor_ms(config: Any, batch: int, context: int, nbytes: int, copy_bw: float, matmul: float) -> dict:
    """The decode step's roofline: roofline.step_work's attention, norms, projections and head,
    with every layer's MLP the router and the experts the batch touches (expected, uniform)."""
    from benchmarks.roofline import Geometry, decode_step_work, floor_ms
    from toolkit.simulator.cost import experts_touched

    g = dataclasses.replace(Geometry.of(config), intermediate=0)       # no dense MLP
    work = decode_step_work(g, [context] * batch, act_bytes=nbytes, kv_bytes=nbytes)
    e, k, d, i = config.num_experts, config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size
    touched = float(experts_touched(batch, e, k))
    router = (d * e * nbytes + batch * (d + e) * nbytes, 2.0 * batch * d * e)
    experts = (touched * 3 * d * i * nbytes + 2 * batch * d * nbytes, 2.0 * batch * k * 3 * d * i)
    work["moe"] = [router, experts] * config.num_hidden_layers
    by_kind = {kind: floor_ms(ops, copy_bw, matmul) for kind, ops in work.items()}
    return dict(touched=touched, floor_ms=sum(by_kind.values()), floor_by_kind_ms=by_kind)


def bench_decode(llm: Any, config: Any, batches: list[int], context: int, nbytes: int, copy_bw: float,
                 matmul: float, steps: int) -> list[dict]:
    from toolkit.simulator.calibrate import profile_engine

    rows = []
    for b in batches:
        ((_, seconds),) = profile_engine(llm, decode=[(b, context)], steps=steps, warmup=3)
        row = dict(batch=b, context=context, measured_ms=seconds * 1e3,
                   **decode_floor_ms(config, b, context, nbytes, copy_bw, matmul))
        row["ratio"] = row["measured_ms"] / row["floor_ms"]
        print(f"  decode B={b:<4d} L={context}  {row['measured_ms']:.3f} ms against a floor of "
              f"{row['floor_ms']:.3f} ms ({row['ratio']:.2f}x)", flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- ShareGPT

def bench_sharegpt(config: Any, args: Any) -> dict:
    from benchmarks.throughput import random_workload, run_hf, run_toolkit, sharegpt_workload

    reqs = (sharegpt_workload(args.data, args.num, config.vocab_size) if os.path.exists(args.data)
            else random_workload(args.num, config.vocab_size))
    workload = f"sharegpt-{len(reqs)}" if os.path.exists(args.data) else f"random-{len(reqs)}"
    opts = SimpleNamespace(attention="triton", max_num_seqs=1024, max_num_batched_tokens=16384,
                           kv_fraction=args.kv_fraction, temperature=0.0, repetition_penalty=1.0,
                           diagnose=False, repeats=1, kinds=False, bands=False, penalty_ab=False,
                           hf_num=args.hf_num)
    out = dict(workload=workload, toolkit=run_toolkit(config, reqs, opts))
    if args.hf_num:
        out["hf"] = run_hf(config, reqs[: args.hf_num], 0.0)
        tk = out["toolkit"].get("hf_subset", out["toolkit"]["all"])
        out["ratio"] = tk["tok_s"] / out["hf"]["tok_s"]
    return out


def toy_throughput(llm: Any, config: Any, n: int, max_new: int) -> dict:
    """The CPU stand-in of the ShareGPT part: n short random prompts through LLM.generate, and
    through HF `generate` one at a time on the same (random) weights' shape."""
    from transformers import AutoModelForCausalLM

    from toolkit import SamplingParams

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, config.vocab_size, (int(x),), generator=g).tolist()
               for x in torch.randint(8, 40, (n,), generator=g)]
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0, ignore_eos=True), use_tqdm=False)
    tk_s = time.perf_counter() - t
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    t = time.perf_counter()
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                        do_sample=False, pad_token_id=0)
    hf_s = time.perf_counter() - t
    want = n * max_new
    tk, hfr = dict(requests=n, output_tokens=want, seconds=tk_s, tok_s=want / tk_s), \
        dict(requests=n, output_tokens=want, seconds=hf_s, tok_s=want / hf_s)
    return dict(workload=f"random-{n} (toy)", toolkit={"all": tk}, hf=hfr, ratio=tk["tok_s"] / hfr["tok_s"])


# ---------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="kernel,decode,sharegpt", help="comma list of kernel, decode, sharegpt")
    ap.add_argument("--toy", action="store_true", help="the 2-layer CPU stand-in (a check, not a figure)")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512", help="the kernel part's token counts")
    ap.add_argument("--batches", default="1,16,256", help="the decode part's batch sizes")
    ap.add_argument("--context", type=int, default=512, help="the decode part's context per sequence")
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per batch size")
    ap.add_argument("--data", default="benchmarks/data/sharegpt.json", help="benchmarks/sharegpt_prep.py's file")
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--hf-num", type=int, default=64, help="HF runs the first N requests (0: skip)")
    ap.add_argument("--kv-fraction", type=float, default=0.85)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    parts = args.parts.split(",")
    bad = sorted(set(parts) - {"kernel", "decode", "sharegpt"})
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; valid: kernel, decode, sharegpt")
    if args.toy:
        from benchmarks.sim_common import tiny_moe_config

        config, device, dtype, shape = tiny_moe_config(), "cpu", torch.float32, "tiny-moe"
        tokens, batches = [1, 8], [1, 4]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("the H200 benchmark needs CUDA; --toy runs the CPU stand-in")
        from toolkit.models.shapes import qwen3_30b_a3b

        config, device, dtype, shape = qwen3_30b_a3b(), "cuda", torch.bfloat16, SHAPE
        tokens, batches = [int(x) for x in args.tokens.split(",")], [int(x) for x in args.batches.split(",")]
    threads = torch.get_num_threads()
    if args.toy:
        torch.set_num_threads(1)             # steadier times on a shared CPU
    try:
        run(args, parts, config, device, dtype, shape, tokens, batches)
    finally:
        torch.set_num_threads(threads)       # `python -m benchmarks` may run it in a test's process


def run(args: Any, parts: list[str], config: Any, device: str, dtype: torch.dtype, shape: str,
        tokens: list[int], batches: list[int]) -> None:
    start = time.time()
    copy_bw, matmul = peaks()
    res: dict[str, Any] = dict(shape=shape, device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                               torch=torch.__version__, date=time.strftime("%Y-%m-%d"), copy_bw=copy_bw,
                               matmul_flops=matmul, grouped_mm=hasattr(torch, "_grouped_mm"), toy=args.toy)
    e, k = config.num_experts, config.num_experts_per_tok
    d, i = config.hidden_size, config.moe_intermediate_size
    print(f"{shape}: {e} experts top-{k}, hidden {d}, expert intermediate {i}; copy {copy_bw / 1e9:.0f} GB/s, "
          f"matmul {matmul / 1e12:.1f} TFLOP/s", flush=True)
    if "kernel" in parts:
        res["kernel"] = bench_kernel(tokens, e, k, d, i, dtype, device, copy_bw, matmul)
    if "decode" in parts or ("sharegpt" in parts and args.toy):
        from toolkit import LLM

        if args.toy:
            llm = LLM(config, device="cpu", dtype="float32", num_blocks=256, block_size=16, max_num_seqs=16,
                      max_num_batched_tokens=256, enable_prefix_caching=False)
        else:
            llm = LLM(config, dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192,
                      gpu_memory_utilization=args.kv_fraction, max_model_len=4096, enable_prefix_caching=False)
        with llm:
            if "decode" in parts:
                res["decode"] = bench_decode(llm, config, batches, 32 if args.toy else args.context,
                                             torch.tensor([], dtype=dtype).element_size(), copy_bw, matmul,
                                             4 if args.toy else args.steps)
            if "sharegpt" in parts and args.toy:
                res["sharegpt"] = toy_throughput(llm, config, 4, 8)
        from benchmarks.sim_common import release_llm

        release_llm(llm)                 # the weights' memory back before the ShareGPT part's engine
    if "sharegpt" in parts and not args.toy:
        res["sharegpt"] = bench_sharegpt(config, args)
    res["wall_s"] = time.time() - start
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
