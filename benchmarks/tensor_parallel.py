"""Tensor parallelism on one host: TP=2 against TP=1, same machine, one call.

    (a) greedy outputs (32 tokens) equal at TP=1 and TP=2 on the Llama-3.1-8B shape, random
        bf16 weights whose input embedding is scaled (as benchmarks/speculative.py: the argmax
        then has a wide margin bf16 cannot flip), and the first step's logits within 2%
        (max |TP2 - TP1| / max |TP1|)
    (b) ShareGPT throughput (benchmarks/data/sharegpt.json from sharegpt_prep.py; a synthetic
        length mix with ShareGPT's means when the file is absent), with the median step time
    (c) decode step time: batches of B sequences at a context of C tokens, median of the steps
    (d) the all-reduce alone (2 processes, NCCL; eager and replayed from a CUDA graph, which is
        how decode steps run it) at the step's sizes [T, hidden] bf16 and at 64 / 256 MiB
        (NCCL's own large-message bus bandwidth); and its share of a TP=2 decode step:
        (2 x layers + 1) all-reduces of [B, hidden] against the step's time

    python -m benchmarks tensor_parallel
    python -m benchmarks tensor_parallel --quick       # the CPU: tiny model, gloo, seconds
    python -m benchmarks tensor_parallel --shape llama70b --tp 2 --sections sharegpt,decode
        # the model that needs both GPUs (TP=1 cannot hold it); the decode step against the
        # HBM floor of two H200s (each reads its half of the weights)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

# NVLink multicast stays off on the shared H200 hosts (device/KINDS.md); spawned ranks inherit it
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

HBM_BYTES_PER_S = 4.8e12          # H200 HBM3e, per GPU


def shape(name: str):
    from transformers import LlamaConfig

    from toolkit.models.shapes import llama31_8b

    if name == "llama8b":
        return llama31_8b()
    if name == "llama70b":        # Llama-3.1-70B: hidden 8192, 80 layers, 64 q / 8 kv heads x 128
        cfg = llama31_8b().to_dict()
        cfg.update(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                   intermediate_size=28672)
        return LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    if name == "tiny":
        return LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                           num_key_value_heads=2, vocab_size=517, max_position_embeddings=1024,
                           eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    raise SystemExit(f"unknown shape {name!r}")


def scale_embedding(model, factor: float) -> None:
    """The input embedding (of the TP=1 model, or of a rank's shard: its rows) times factor."""
    model.model.embed_tokens.weight.data.mul_(factor)


def scale_shard_embedding(shard, factor: float) -> None:
    """On every rank, through TPExecutor.call(fn, ...): fn gets the rank's ModelRunner."""
    scale_embedding(shard.model, factor)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_llm(cfg, tp: int, args):
    from toolkit import LLM

    llm = LLM(cfg, tensor_parallel_size=tp, dtype=args.dtype, device=args.device, attention=args.attention,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              gpu_memory_utilization=args.kv_fraction, enable_prefix_caching=False,
              max_model_len=args.max_model_len, **({"kv_cache_bytes": 64 << 20} if args.quick else {}))
    if args.embed_scale != 1.0:
        ex = llm.engine.runner.executor
        if ex is not None:
            ex.call(scale_shard_embedding, args.embed_scale)
        else:
            scale_embedding(llm.engine.model, args.embed_scale)
    return llm


# -------------------------------------------------------------------------- (a)
def first_step_logits(llm, prompts: list[list[int]]) -> torch.Tensor:
    """Logits [N, V] of one prefill step of the prompts (the runner directly, blocks of a
    free cache: what a real request writes first is overwritten before it is read)."""
    from toolkit.types import Request, SamplingParams, ScheduledRequest, SchedulerOutput

    bs = llm.engine.block_size
    sched, nxt = [], 0
    for i, p in enumerate(prompts):
        n = -(-len(p) // bs)
        sched.append(ScheduledRequest(Request(f"probe-{i}", p, SamplingParams(max_tokens=1)), 0, len(p),
                                      list(range(nxt, nxt + n))))
        nxt += n
    runner = llm.engine.runner
    with torch.inference_mode():
        logits = runner.forward(runner.prepare(SchedulerOutput(sched)))
    return logits.float().cpu()


def greedy(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    from toolkit import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


# -------------------------------------------------------------------------- (b)
def workload(args, vocab: int) -> tuple[list[tuple[list[int], int]], str]:
    path = Path(args.data)
    rng = random.Random(0)
    if path.is_file() and not args.quick:
        data = json.loads(path.read_text())["requests"][: args.num]
        return [([t % vocab for t in r["prompt_ids"]], r["output_len"]) for r in data], f"sharegpt ({path})"
    # synthetic: ShareGPT-like lengths (lognormal, prompt mean ~ 230, output ~ 200 tokens), capped
    lo, cap = (4, 48) if args.quick else (4, 1024)
    reqs = []
    for _ in range(args.num):
        p = min(cap, max(lo, int(rng.lognormvariate(4.9, 1.0))))
        o = min(cap, max(lo, int(rng.lognormvariate(4.8, 0.9))))
        reqs.append(([rng.randrange(vocab) for _ in range(p)], o))
    why = "--quick" if args.quick else f"{path} absent"
    return reqs, f"synthetic (ShareGPT-like lengths; {why})"


def throughput(llm, reqs) -> dict:
    from toolkit import SamplingParams

    records = []
    llm.engine.add_observer(records.append)
    sync()
    t0 = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                                                for _, n in reqs], use_tqdm=False)
    sync()
    dt = time.perf_counter() - t0
    llm.engine.remove_observer(records.append)
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = [r.duration * 1e3 for r in records]
    decode = [r.duration * 1e3 for r in records if r.num_prefill_tokens == 0]
    return dict(requests=len(reqs), output_tokens=produced, seconds=dt, tok_s=produced / dt,
                steps=len(records), median_step_ms=statistics.median(steps),
                median_decode_only_step_ms=statistics.median(decode) if decode else None)


# -------------------------------------------------------------------------- (c)
def decode_steps(llm, batch: int, context: int, steps: int, vocab: int) -> float:
    """Median ms of steps that run `batch` decodes and nothing else, at ~`context` tokens."""
    from toolkit import SamplingParams

    eng = llm.engine
    rng = random.Random(batch)
    ids = [eng.add_request([rng.randrange(vocab) for _ in range(context)],
                           SamplingParams(max_tokens=steps + 8 + context, temperature=0, ignore_eos=True))
           for _ in range(batch)]
    records = []
    eng.add_observer(records.append)
    for _ in range(10_000):
        eng.step()
        pure = [r for r in records if r.num_prefill_tokens == 0 and r.num_decode_tokens == batch]
        if len(pure) >= steps + 3:
            break
    eng.remove_observer(records.append)
    eng.abort(ids)
    while eng.has_unfinished():
        eng.step()
    return statistics.median(r.duration * 1e3 for r in pure[3:])


# -------------------------------------------------------------------------- (d)
def _allreduce_rank(rank: int, size: int, port: int, sizes: list[int], device_type: str, conn) -> None:
    import datetime

    from toolkit.parallel.group import make_group

    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    store = torch.distributed.TCPStore("127.0.0.1", port, size, False, timeout=datetime.timedelta(seconds=120))
    group = make_group(store, rank, size, device)
    dtype = torch.bfloat16 if cuda else torch.float32
    out = []
    for n in sizes:
        x = torch.randn(n, dtype=dtype, device=device)
        iters = 20 if n * x.element_size() < (64 << 20) else 5
        for _ in range(3):
            group.all_reduce(x)
        eager, graph = [], None
        for _ in range(iters):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                group.all_reduce(x)
                b.record()
                b.synchronize()
                eager.append(a.elapsed_time(b) * 1e-3)
            else:
                t0 = time.perf_counter()
                group.all_reduce(x)
                eager.append(time.perf_counter() - t0)
        if cuda and n * x.element_size() <= (64 << 20):      # replayed from a graph, as decode steps run it
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                g.capture_begin()
                for _ in range(10):
                    group.all_reduce(x)
                g.capture_end()
            torch.cuda.current_stream().wait_stream(s)
            g.replay()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                g.replay()
            b.record()
            b.synchronize()
            graph = a.elapsed_time(b) * 1e-3 / 100
        out.append(dict(elements=n, bytes=n * x.element_size(), eager_s=statistics.median(eager), graph_s=graph))
    if rank == 0:
        conn.send(out)
    os._exit(0)


def allreduce_bench(args, hidden: int, token_counts: list[int]) -> list[dict]:
    import datetime

    ctx = torch.multiprocessing.get_context("spawn")
    store = torch.distributed.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=120),
                                       wait_for_workers=False)
    sizes = [t * hidden for t in token_counts] + ([] if args.quick else [32 << 20, 128 << 20])
    r, w = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_allreduce_rank, args=(rank, 2, store.port, sizes, args.device, w), daemon=True)
             for rank in range(2)]
    for p in procs:
        p.start()
    if not r.poll(300):
        raise SystemExit("the all-reduce benchmark did not finish within 300 s")
    rows = r.recv()
    for p in procs:
        p.join(30)
    for row in rows:               # bus bandwidth of an all-reduce over n ranks: 2 (n-1) / n x bytes / t
        row["tokens"] = row["elements"] // hidden
        row["busbw_GBps_eager"] = row["bytes"] / row["eager_s"] / 1e9
        row["busbw_GBps_graph"] = row["bytes"] / row["graph_s"] / 1e9 if row["graph_s"] else None
    return rows


# -------------------------------------------------------------------------- main
def run_tp(cfg, tp: int, args, probe: list[list[int]], reqs) -> dict:
    res: dict = {}
    t0 = time.perf_counter()
    llm = make_llm(cfg, tp, args)
    res["startup_s"] = time.perf_counter() - t0
    res["kv_blocks"] = llm.engine.num_blocks
    print(f"TP={tp}: started in {res['startup_s']:.1f} s, {res['kv_blocks']} KV blocks", flush=True)
    if "equal" in args.sections:
        res["logits"] = first_step_logits(llm, probe)
        res["tokens"] = greedy(llm, probe, args.equal_tokens)
    if "decode" in args.sections:
        res["decode_ms"] = {b: decode_steps(llm, b, args.context, args.decode_steps, cfg.vocab_size)
                            for b in args.batches}
        print(f"TP={tp}: decode step ms {res['decode_ms']}", flush=True)
    if "sharegpt" in args.sections:
        res["sharegpt"] = throughput(llm, reqs)
        s = res["sharegpt"]
        print(f"TP={tp}: {s['requests']} requests, {s['output_tokens']} tokens in {s['seconds']:.1f} s = "
              f"{s['tok_s']:.0f} tok/s, median step {s['median_step_ms']:.2f} ms", flush=True)
    llm.close()
    del llm
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny model on the CPU over gloo (a smoke run)")
    ap.add_argument("--shape", default="llama8b", choices=["llama8b", "llama70b", "tiny"])
    ap.add_argument("--tp", default="1,2", help="tensor-parallel sizes to run, in order")
    ap.add_argument("--sections", default="equal,decode,sharegpt,allreduce")
    ap.add_argument("--data", default="benchmarks/data/sharegpt.json")
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--equal-prompts", type=int, default=8)
    ap.add_argument("--equal-tokens", type=int, default=32)
    ap.add_argument("--embed-scale", type=float, default=64.0)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=30)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--kv-fraction", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.shape, args.num, args.batches, args.context, args.decode_steps = "tiny", 24, [1, 4], 24, 6
        args.equal_prompts, args.equal_tokens, args.max_model_len = 3, 8, 256
        args.device, args.dtype, args.attention = "cpu", "float32", "cpu"
    else:
        if torch.cuda.device_count() < 2 and "2" in args.tp.split(","):
            raise SystemExit(f"TP=2 needs 2 GPUs; {torch.cuda.device_count()} visible (--quick runs on the CPU)")
        args.device, args.dtype, args.attention = "cuda", "bfloat16", "triton"
    args.sections = set(args.sections.split(","))
    cfg = shape(args.shape)
    rng = random.Random(0)
    probe = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(16, 200 if not args.quick else 30))]
             for _ in range(args.equal_prompts)]
    reqs, source = workload(args, cfg.vocab_size)
    print(f"{args.shape}: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers; workload {source}: "
          f"{len(reqs)} requests, {sum(n for _, n in reqs)} output tokens; "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}", flush=True)
    runs = {int(tp): run_tp(cfg, int(tp), args, probe, reqs) for tp in args.tp.split(",")}
    result: dict = dict(args={k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
                        workload=source, date=time.strftime("%Y-%m-%d %H:%M"),
                        device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu")
    lines = []
    if "equal" in args.sections and 1 in runs and 2 in runs:
        a, b = runs[1].pop("logits"), runs[2].pop("logits")
        rel = ((a - b).abs().max() / a.abs().max()).item()
        same = sum(x == y for x, y in zip(runs[1].pop("tokens"), runs[2].pop("tokens")))
        result["equal"] = dict(identical_outputs=f"{same}/{len(probe)}", tokens=args.equal_tokens,
                               first_step_logits_rel_diff=rel, pass_=same == len(probe) and rel < 0.02)
        lines.append(f"(a) greedy {args.equal_tokens} tokens identical: {same}/{len(probe)}; first-step logits "
                     f"max|diff|/max|x| = {rel:.2e} (< 2%: {rel < 0.02})")
    for r in runs.values():
        r.pop("logits", None), r.pop("tokens", None)
    result["runs"] = runs
    if "sharegpt" in args.sections:
        for tp, r in runs.items():
            s = r["sharegpt"]
            lines.append(f"(b) TP={tp}: {s['tok_s']:.0f} tok/s, median step {s['median_step_ms']:.2f} ms "
                         f"(decode-only {s['median_decode_only_step_ms']})")
        if 1 in runs and 2 in runs:
            lines.append(f"    TP=2 / TP=1 throughput: {runs[2]['sharegpt']['tok_s'] / runs[1]['sharegpt']['tok_s']:.2f}x")
    if "decode" in args.sections:
        tps = sorted(runs)
        lines.append("(c) decode step ms   " + "  ".join(f"TP={tp}" for tp in tps))
        for bsz in args.batches:
            lines.append(f"    batch {bsz:>4} ctx {args.context}: " + "  ".join(f"{runs[tp]['decode_ms'][bsz]:7.2f}"
                                                                             for tp in tps))
        if not args.quick:
            w = weight_bytes(cfg)
            for tp in tps:
                floor = w / tp / HBM_BYTES_PER_S * 1e3
                result.setdefault("weights_floor_ms", {})[tp] = floor
                lines.append(f"    TP={tp} HBM floor of the weights alone: {floor:.2f} ms a step")
    if "allreduce" in args.sections:
        rows = allreduce_bench(args, cfg.hidden_size, sorted(set(args.batches) | {256, 2048, 8192}
                                                          if not args.quick else set(args.batches)))
        result["allreduce"] = rows
        lines.append("(d) all-reduce alone (2 ranks): tokens x hidden, bytes, eager us, graph us, busbw GB/s (graph)")
        for row in rows:
            g = row["graph_s"]
            lines.append(f"    {row['tokens']:>7} {row['bytes']:>11} {row['eager_s'] * 1e6:9.1f} "
                         f"{(g * 1e6 if g else float('nan')):9.1f} {row['busbw_GBps_graph'] or row['busbw_GBps_eager']:8.1f}")
        if "decode" in args.sections and 2 in runs:
            per = {row["tokens"]: row["graph_s"] or row["eager_s"] for row in rows}
            share = {b: (2 * cfg.num_hidden_layers + 1) * per[b] * 1e3 / runs[2]["decode_ms"][b]
                     for b in args.batches if b in per}
            result["allreduce_share_of_tp2_decode_step"] = share
            lines.append("    all-reduce share of a TP=2 decode step: " +
                         ", ".join(f"batch {b}: {s:.0%}" for b, s in share.items()))
    print("\n".join(lines))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.out}")


def weight_bytes(cfg) -> float:
    """bf16 bytes of the weights one decode step reads (embedding rows aside: a gather)."""
    h, i, L, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    d = h // cfg.num_attention_heads
    per_layer = h * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d + h * h + 3 * h * i
    return 2.0 * (L * per_layer + v * h)        # + the LM head


if __name__ == "__main__":
    main()
