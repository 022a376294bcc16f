"""FP8 (e4m3) KV cache: what it costs in accuracy and what it buys in capacity and bandwidth.

    python -m benchmarks fp8_kv --mode cpu [--quick]           # the embedded SmolLM2-135M, CPU
    python -m benchmarks fp8_kv --mode gpu [--quick]           # Llama-3.1-8B shape, H200

Divergence (both modes), fp8 against the model's dtype (float32 on the CPU, bf16 on the GPU),
the same weights in one process:
  * next-token distributions, teacher-forced: each prompt of PROMPTS followed by the model
    dtype's 128-token greedy continuation is prefilled through each engine's model, attention
    and KV cache (the fp8 engine's queries attend to its quantised cache, exactly as a decode
    would); per position, KL(p_model || p_fp8) and total variation 0.5 * sum |p - q|, in float64,
    over the continuation positions (and, in the JSON, over every position); and the share of
    positions whose argmax agrees.
  * greedy agreement: 128 greedy tokens per prompt (ignore_eos) from each engine; the share of
    the 128 tokens before the first difference (mean over prompts), and the prompts identical
    throughout.
  CPU mode also compares calibration headrooms (scale = amax x headroom / 448; --headrooms).
GPU mode adds, at the Llama-3.1-8B shape with random weights (random-weight distributions
are nearly flat: their divergence says little about a trained model's, the CPU figures do):
  * capacity: a KV pool limited to --kv-gib GiB, bf16 vs fp8: the blocks it holds, the
    largest batch of (prompt 1024 + output 1024)-token requests it holds to the end (pool
    tokens // 2048), run at once to show it does (no preemption) and its decode throughput;
    and ShareGPT throughput (--data from benchmarks/sharegpt_prep.py; a synthetic
    ShareGPT-like set when the file is absent) with the preemptions each pool caused.
  * decode attention bandwidth with fp8 KV, as benchmarks/attention.py measures it: bytes
    moved (1-byte K/V) / median CUDA-graph time, against a copy and the bf16 cache's time.
Prints tables; writes benchmarks/results/fp8_kv_{cpu,gpu}.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import random
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "The three most important inventions of the nineteenth century were",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain to a ten-year-old why the sky is blue.",
    "Write a short poem about the sea at night.",
    "Translate into French: 'The library opens at nine and closes at six.'",
    "List five tips for a job interview:\n1.",
    "Once upon a time, in a village at the edge of a great forest,",
    "The difference between a list and a tuple in Python is",
    "Photosynthesis is the process by which",
    "Q: If a train travels 120 km in 1.5 hours, what is its average speed?\nA:",
    "Dear hiring manager, I am writing to apply for",
    "The main causes of the French Revolution were",
    "SELECT name, COUNT(*) FROM orders",
    "A recipe for a simple tomato soup:\nIngredients:",
    "In machine learning, overfitting means",
    "The best way to learn to play the guitar is",
]
GEN_TOKENS = 128


# -- divergence ---------------------------------------------------------------------------

@torch.inference_mode()
def teacher_forced_logprobs(llm: Any, ids: list[int]) -> torch.Tensor:
    """log-softmax [T, V] (float64, on the CPU) of the next token at every position of ids,
    through the engine's own model, attention backend and KV cache (blocks 0.. of an idle
    engine without prefix caching, so nothing the allocator holds is touched)."""
    from toolkit.blocks.layout import PagedKVLayout

    r = llm.engine.runner
    bs = r.kv_cache.block_size
    n = len(ids)
    layout = PagedKVLayout.build([list(range(-(-n // bs)))], [n], [n], bs, r.device)
    r.attention.plan(layout)
    x = torch.tensor(ids, dtype=torch.long, device=r.device)
    hidden = r.model.forward(x, torch.arange(n, device=r.device), r.attention)
    return torch.log_softmax(r.model.compute_logits(hidden).double(), -1).cpu()


def distribution_metrics(ref: torch.Tensor, test: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per position: KL(ref || test), total variation, argmax agreement (log-probs [T, V])."""
    p = ref.exp()
    kl = (p * (ref - test)).sum(-1).clamp_min(0)
    tv = 0.5 * (p - test.exp()).abs().sum(-1)
    return {"kl": kl, "tv": tv, "top1": (ref.argmax(-1) == test.argmax(-1)).double()}


def greedy(llm: Any, prompts: list[Any], n: int) -> list[list[int]]:
    from toolkit import SamplingParams

    sp = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    prefix = []
    for x, y in zip(a, b):
        k = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), len(x))
        prefix.append(k / len(x))
    return {"greedy_prefix_agreement": sum(prefix) / len(prefix),
            "identical_sequences": sum(p == 1.0 for p in prefix) / len(prefix),
            "positionwise_match": sum(s == t for x, y in zip(a, b) for s, t in zip(x, y))
            / sum(len(x) for x in a)}


def summarize(m: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    kl, tv, top1 = (torch.cat(m[k]) for k in ("kl", "tv", "top1"))
    return {"kl_mean": float(kl.mean()), "kl_p99": float(kl.quantile(0.99)), "kl_max": float(kl.max()),
            "tv_mean": float(tv.mean()), "tv_p99": float(tv.quantile(0.99)),
            "top1_agreement": float(top1.mean()), "positions": int(kl.numel())}


def reference_run(ref_llm: Any, prompts: list[list[int]], gen: int) -> dict[str, Any]:
    """The model dtype's greedy continuations and teacher-forced log-probs (float32, CPU), once."""
    out = greedy(ref_llm, prompts, gen)
    seqs = [list(p) + o[:-1] for p, o in zip(prompts, out)]   # position len(p)-1+i predicts o[i]
    return {"prompts": prompts, "out": out, "seqs": seqs,
            "logprobs": [teacher_forced_logprobs(ref_llm, s).float() for s in seqs]}


def divergence(ref: dict[str, Any], fp8_llm: Any, gen: int) -> dict[str, Any]:
    """Greedy agreement over `gen` tokens and teacher-forced distribution metrics."""
    fp8_out = greedy(fp8_llm, ref["prompts"], gen)
    cont: dict[str, list[torch.Tensor]] = {"kl": [], "tv": [], "top1": []}
    every: dict[str, list[torch.Tensor]] = {"kl": [], "tv": [], "top1": []}
    for p, seq, lp in zip(ref["prompts"], ref["seqs"], ref["logprobs"]):
        m = distribution_metrics(lp.double(), teacher_forced_logprobs(fp8_llm, seq))
        for k in m:
            cont[k].append(m[k][len(p) - 1:])
            every[k].append(m[k])
    return {"continuation": summarize(cont), "all_positions": summarize(every),
            **agreement(ref["out"], fp8_out)}


def print_divergence(label: str, d: dict[str, Any], gen: int) -> None:
    c = d["continuation"]
    print(f"  {label:34s} KL mean {c['kl_mean']:.2e} (p99 {c['kl_p99']:.2e}, max {c['kl_max']:.2e})  "
          f"TV mean {c['tv_mean']:.4f} (p99 {c['tv_p99']:.4f})  top-1 {100 * c['top1_agreement']:.1f}%  "
          f"greedy {100 * d['greedy_prefix_agreement']:.1f}% of {gen} before the first "
          f"difference, {100 * d['identical_sequences']:.0f}% of prompts identical", flush=True)


def set_headroom(llm: Any, headroom: tuple[float, float]) -> None:
    """Recalibrate an fp8 engine's scales with another headroom (same prompts as start-up)."""
    from toolkit.registry import create_part
    from toolkit.worker.kv_scales import calibrate, calibration_prompts

    eng, r = llm.engine, llm.engine.runner
    model = r.model
    name = "triton" if r.device.type == "cuda" else "cpu"
    from toolkit.attention.layerwise import build_attention

    k, v = calibrate(model, calibration_prompts(eng.tokenizer, model.spec.vocab_size),
                     lambda c: build_attention(model.spec, lambda **kw: create_part("attention", name, kv_cache=c, **kw)),
                     model.spec.dtype, r.device, r.kv_cache.block_size, headroom=headroom)
    r.kv_cache.set_scales(k, v, f"calibrated (amax x {headroom[0]:g}, {headroom[1]:g} / 448)")


class RoundKV:
    """An attention backend whose K/V are rounded to `dtype` before they are written: what a
    cache of that dtype would cost, for context (the model's own dtype unchanged)."""

    def __init__(self, inner: Any, dtype: torch.dtype) -> None:
        self.inner, self.dtype = inner, dtype

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.inner.write_kv(layer, k.to(self.dtype).to(k.dtype), v.to(self.dtype).to(v.dtype))


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


# -- CPU mode ------------------------------------------------------------------------------

def run_cpu(args: argparse.Namespace) -> dict[str, Any]:
    from toolkit import LLM

    n_prompts, gen = (4, 32) if args.quick else (len(PROMPTS), GEN_TOKENS)
    opts = dict(enable_prefix_caching=False, num_blocks=512, max_num_seqs=16)
    ref = LLM(**opts)
    fp8 = LLM(kv_cache_dtype="fp8", **opts)
    prompts = [ref.engine.tokenize(p)[1] for p in PROMPTS[:n_prompts]]
    res: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (embedded)", "model_dtype": "float32",
                           "prompts": n_prompts, "gen_tokens": gen, "machine": machine(),
                           "scales_source": fp8.engine.runner.kv_cache.scales_source, "headrooms": {}}
    print(f"fp8 vs float32 on the embedded model, {n_prompts} prompts x {gen} tokens:")
    base = reference_run(ref, prompts, gen)
    if "default" in args.variants:   # the engine as built: LLM(kv_cache_dtype="fp8")
        res["default"] = d = divergence(base, fp8, gen)
        print_divergence(f"default ({res['scales_source']})", d, gen)
    for h in args.headrooms if "headroom" in args.variants else ():
        set_headroom(fp8, (h, h))
        t0 = time.perf_counter()
        d = divergence(base, fp8, gen)
        d["seconds"] = time.perf_counter() - t0
        res["headrooms"][str(h)] = d
        print_divergence(f"headroom {h:g} (scale = amax x {h:g}/448)", d, gen)
    if "vllm" in args.variants:   # vLLM's calculate_kv_scales constants: k = amax/200, v = amax/100
        set_headroom(fp8, (448 / 200, 448 / 100))
        res["vllm_constants"] = d = divergence(base, fp8, gen)
        print_divergence("vLLM's amax/200 (K), amax/100 (V)", d, gen)
    if "bf16kv" in args.variants:   # context: the same model with K/V rounded to bf16 (8-bit mantissa)
        r = ref.engine.runner
        r.attention = RoundKV(r.attention, torch.bfloat16)
        res["bf16_kv_context"] = d = divergence(base, ref, gen)
        r.attention = r.attention.inner
        print_divergence("context: K/V rounded to bf16", d, gen)
    ref.close()
    fp8.close()
    return res


# -- GPU mode ------------------------------------------------------------------------------

def synthetic_sharegpt(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """ShareGPT-like lengths (lognormal, the prepped set's means ~246 prompt / ~204 output
    tokens, prompt <= 1024, total <= 2048) over random token ids."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p, o = int(rng.lognormvariate(4.9, 1.0)), int(rng.lognormvariate(4.8, 0.9))
        if 4 <= p <= 1024 and 4 <= o and p + o <= 2048:
            out.append(([rng.randrange(vocab) for _ in range(p)], o))
    return out


def sharegpt(path: str, n: int, vocab: int) -> tuple[list[tuple[list[int], int]], str]:
    if Path(path).exists():
        data = json.loads(Path(path).read_text())["requests"][:n]
        return [([t % vocab for t in r["prompt_ids"]], r["output_len"]) for r in data], path
    print(f"  {path} absent: a synthetic ShareGPT-like workload (benchmarks/sharegpt_prep.py makes the file)")
    return synthetic_sharegpt(n, vocab), "synthetic"


def gpu_llm(cfg: Any, kv: str, kv_bytes: int, max_num_seqs: int) -> Any:
    from toolkit import LLM, SamplingParams

    llm = LLM(cfg, dtype="bfloat16", kv_cache_dtype=kv, kv_cache_bytes=kv_bytes, seed=0,
              enable_prefix_caching=False, max_num_seqs=max_num_seqs, max_model_len=4096)
    llm.generate([[1] * 300, [2] * 20], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                 use_tqdm=False)                      # compile before anything is timed
    return llm


def run_requests(llm: Any, reqs: list[tuple[list[int], int]]) -> dict[str, Any]:
    """All requests at once (ignore_eos); throughput, most running at once, preemptions."""
    from toolkit import SamplingParams
    from toolkit.engine.gc_freeze import frozen_heap

    eng = llm.engine
    sync()
    pre0, t0 = eng.num_preemptions, time.perf_counter()
    for p, n in reqs:
        eng.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    produced = most = 0
    with frozen_heap():     # as LLM.generate: no full GC pass inside a step
        while eng.has_unfinished():
            for o in eng.step():
                produced += len(o.new_token_ids)
            most = max(most, eng.scheduler.num_running)
    sync()
    dt = time.perf_counter() - t0
    return {"requests": len(reqs), "output_tokens": produced, "seconds": dt, "tok_s": produced / dt,
            "max_running": most, "preemptions": eng.num_preemptions - pre0}


def decode_bandwidth(batches: list[int], contexts: list[int]) -> list[dict[str, Any]]:
    """Decode attention, Llama-3.1-8B heads (32 q / 8 kv x 128), bf16 vs fp8 cache."""
    from benchmarks.attention import copy_bandwidth, graph_ms, paged_case
    from toolkit.attention.torch_ref import paged_attention_ref
    from toolkit.attention.triton_paged import TritonPagedAttention
    from toolkit.blocks.kv_cache import KVCache
    from toolkit.kernels.reference import quantize_fp8

    h, h_kv, d = 32, 8, 128
    copy_bw = copy_bandwidth()
    rows = []
    for b in batches:
        for ctx in contexts:
            if 3 * 2 * b * ctx * h_kv * d * 2 > torch.cuda.mem_get_info()[0]:
                print(f"  skip b{b} c{ctx}: does not fit")
                continue
            cache, layout, q, tables = paged_case(h, h_kv, d, [ctx] * b, [1] * b, b * ctx)
            fp8 = KVCache(1, cache.num_blocks, cache.block_size, h_kv, d, torch.float8_e4m3fn, "cuda")
            ks, vs = (float(cache[0][i].abs().amax()) / 448 for i in (0, 1))
            fp8[0][0], fp8[0][1] = quantize_fp8(cache[0][0], ks), quantize_fp8(cache[0][1], vs)
            fp8.set_scales([ks], [vs])
            row: dict[str, Any] = {"batch": b, "ctx": ctx, "copy_bw": copy_bw}
            for name, c in (("bf16", cache), ("fp8", fp8)):
                attn = TritonPagedAttention(c, h, d)
                attn.plan(layout)
                out = torch.full_like(q, float("nan"))
                attn.run(0, q, out=out)
                num = den = 0.0
                for s in (0, b - 1):              # against the reference twin on two sequences
                    want = paged_attention_ref(q[s:s + 1], c[0], tables[s], ctx, d ** -0.5,
                                               k_scale=c.k_scales[0], v_scale=c.v_scales[0])
                    num += float((out[s:s + 1].float() - want).norm() ** 2)
                    den += float(want.norm() ** 2)
                ms = graph_ms(lambda: attn.run(0, q, out=out))
                moved = 2 * b * ctx * h_kv * d * c[0].element_size() + 2 * q.numel() * q.element_size()
                row[name] = {"us": ms * 1e3, "pct_copy": 100 * moved / (ms * 1e-3) / copy_bw,
                             "err": (num / den) ** 0.5, "splits": attn.schedule.num_splits}
            row["speedup"] = row["bf16"]["us"] / row["fp8"]["us"]
            rows.append(row)
            print(f"  b{b:<4d} c{ctx:<6d} bf16 {row['bf16']['us']:8.1f} us ({row['bf16']['pct_copy']:5.1f}% copy)"
                  f"  fp8 {row['fp8']['us']:8.1f} us ({row['fp8']['pct_copy']:5.1f}% copy, err "
                  f"{row['fp8']['err']:.1e})  speedup {row['speedup']:.2f}x", flush=True)
            del cache, fp8
            torch.cuda.empty_cache()
    return rows


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tiny_config() -> Any:
    """--tiny: a small random Llama, so that GPU mode's code runs on a CPU end to end."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096,
                       eos_token_id=2, bos_token_id=1)


def run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    from toolkit.models.shapes import llama31_8b

    parts = set(args.parts)
    cfg = tiny_config() if args.tiny else llama31_8b()
    kv_bytes = 2**19 if args.tiny else int(args.kv_gib * 2**30)
    n_req = 16 if args.tiny else 64 if args.quick else args.num
    workload, source = sharegpt(args.data, n_req, cfg.vocab_size)
    rng = random.Random(1)
    n_prompts, long_len = (4, 128) if args.tiny else (16, 1024)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(64, 512))] for _ in range(n_prompts)]
    res: dict[str, Any] = {"model": "tiny random Llama (--tiny)" if args.tiny else
                           "Llama-3.1-8B shape, random weights, bf16", "machine": machine(),
                           "kv_gib": kv_bytes / 2**30, "workload": source, "capacity": {}, "sharegpt": {}}
    llms = {}
    for kv in ("auto", "fp8") if parts & {"capacity", "sharegpt", "divergence"} else ():
        t0 = time.perf_counter()
        llm = gpu_llm(cfg, kv, kv_bytes, args.max_num_seqs)
        cache = llm.engine.runner.kv_cache
        print(f"{kv}: {cache!r} (built in {time.perf_counter() - t0:.0f} s)", flush=True)
        if "capacity" in parts:
            # the largest batch of (long_len + long_len)-token requests the pool holds to the end
            # (blocks of 16 divide long_len: no rounding), run at once: must see no preemption
            fits = min(cache.num_tokens // (2 * long_len), args.max_num_seqs)
            reqs = [([rng.randrange(cfg.vocab_size) for _ in range(long_len)], long_len) for _ in range(fits)]
            res["capacity"][kv] = cap = run_requests(llm, reqs)
            cap.update(blocks=cache.num_blocks, tokens=cache.num_tokens, largest_batch=fits)
            print(f"  capacity: {cache.num_blocks} blocks = {cache.num_tokens} tokens: {fits} requests of "
                  f"{long_len} + {long_len} tokens at once ({cap['max_running']} ran together, "
                  f"{cap['preemptions']} preemptions), {cap['tok_s']:.0f} output tok/s", flush=True)
        if "sharegpt" in parts:
            res["sharegpt"][kv] = sg = run_requests(llm, workload)
            print(f"  ShareGPT ({source}) {sg['requests']} requests: {sg['tok_s']:.0f} output tok/s, at "
                  f"most {sg['max_running']} running, {sg['preemptions']} preemptions", flush=True)
        if kv == "fp8":
            res["scales_source"] = cache.scales_source
        if "divergence" in parts:
            llms[kv] = llm
        else:
            llm.close()
    if "divergence" in parts:
        gen = 16 if args.tiny else GEN_TOKENS
        res["divergence"] = d = divergence(reference_run(llms["auto"], prompts, gen), llms["fp8"], gen)
        print_divergence("fp8 vs bf16 (random weights)", d, gen)
    for llm in llms.values():
        llm.close()
    del llms
    gc.collect()
    if "decode" not in parts:
        return res
    if not torch.cuda.is_available():
        print("decode attention bandwidth: needs CUDA, skipped")
        return res
    torch.cuda.empty_cache()
    print("decode attention bandwidth, Llama-3.1-8B heads, bf16 vs fp8 KV:")
    res["decode"] = decode_bandwidth([16, 64] if args.quick else [16, 64, 256],
                                     [4096] if args.quick else [4096, 16384])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a few prompts / requests: proves it runs")
    ap.add_argument("--tiny", action="store_true", help="GPU mode with a tiny model (runs on a CPU)")
    ap.add_argument("--headrooms", type=float, nargs="+", default=[1.0])
    ap.add_argument("--variants", nargs="+", default=["default", "headroom", "bf16kv"],
                    help="CPU mode: fp8 as LLM(kv_cache_dtype='fp8') builds it (vLLM's amax/200, "
                         "amax/100), at each --headrooms (amax x h / 448 for K and V), with vLLM's "
                         "constants set explicitly ('vllm'), and, for context, K/V rounded to bf16")
    ap.add_argument("--parts", nargs="+", default=["capacity", "sharegpt", "divergence", "decode"],
                    help="GPU mode: which measurements (split a run over several 10-minute calls)")
    ap.add_argument("--kv-gib", type=float, default=4.0, help="GPU: the KV pool's byte budget")
    ap.add_argument("--num", type=int, default=1000, help="GPU: ShareGPT requests")
    ap.add_argument("--data", default="benchmarks/data/sharegpt.json")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    res = run_cpu(args) if args.mode == "cpu" else run_gpu(args)
    res.update(date=time.strftime("%Y-%m-%d"), quick=args.quick, seconds=time.perf_counter() - t0)
    tag = "_tiny" if args.tiny else "_quick" if args.quick else ""
    out = Path(args.out or f"benchmarks/results/fp8_kv_{args.mode}{tag}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=lambda x: x if math.isfinite(x) else str(x)))
    print(f"wrote {out} ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
