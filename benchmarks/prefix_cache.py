"""Prefix caching off (free_list), hash chain (prefix_caching) and radix tree (radix), one run.

Two traces of random token ids (random weights at the Llama-3.1-8B shape on the GPU; EOS
ignored, greedy):
  shared  N single-turn requests, each one of 20 system prompts (1-2k tokens) plus a short
          user turn; all arrive at t = 0 (--rate R: Poisson arrivals at R requests / s)
  chat    C conversations of T turns; each turn's prompt is the previous turn's prompt and
          answer plus a new user message, sent when the previous turn finishes (closed loop)
Reported per (trace, allocator): TTFT (mean / p50 / p99), output and total tok/s, wall
seconds, the prefix-cache hit rate (prompt tokens found cached at admission / prompt
tokens), and the host milliseconds spent in the prefix cache (hashing the chain plus the
allocator's lookup / peek / publish).

    python -m benchmarks prefix_cache   # H200, < 5 min
    python -m benchmarks prefix_cache --small                                      # CPU check, tiny model
    # the CPU tier under a GPU pool too small for the working set (H200, ~6 min):
    python -m benchmarks prefix_cache --num 300 --num-blocks 1536 --cpu-cache-gb 16 \
        --allocators hash_chain,hash_chain+cpu,radix+cpu --out benchmarks/results/prefix_cache_cpu_tier.json
    python -m benchmarks prefix_cache --quick      # the same comparison on the CPU (tiny model, ~2 min)

"+cpu" allocators add the host tier (toolkit/blocks/host_tier.py): blocks the device prefix
cache evicts go to --cpu-cache-gb of pinned host memory and come back on a hit. Their rows
add the host tier's counters: blocks stored to the host, blocks loaded back (host hits) and
host hits as a share of the prompt tokens (included in hit_rate).

GPU defaults: 500 shared requests (the issue's 1000 would double the longest run, prefix
caching off, at about 780k prompt tokens for 500; pass --num 1000 with a smaller
--allocators list for the full count) and 48 conversations of 6 turns. TTFT counts from
add_request: with --rate 0 that includes the wait for admission, which is most of it.
`host` (first in the JSON) is the prefix cache's host cost alone, on the GPU trace's
prompt lengths, without a model.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

# the pair compared first, the long baseline last: a run cut short keeps the comparison
ALLOCATORS = {"hash_chain": "prefix_caching", "radix": "radix", "off": "free_list"}
# with the host (CPU) tier: evicted cached blocks are kept in pinned host memory (--cpu-cache-gb)
TIERED = {"hash_chain+cpu": "prefix_caching", "radix+cpu": "radix"}


@dataclass
class Client:
    """One conversation: arrives at `arrival` (s), sends `turns[0]` after `system`, then each
    next user turn after the previous answer."""

    arrival: float
    system: list[int]
    turns: list[list[int]]
    max_tokens: int
    history: list[int] = field(default_factory=list)


def shared_trace(n: int, vocab: int, *, systems: int, sys_len: tuple[int, int], user_len: tuple[int, int],
                 max_tokens: int, rate: float, seed: int = 0) -> list[Client]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*sys_len))] for _ in range(systems)]
    t, out = 0.0, []
    for _ in range(n):
        if rate > 0:
            t += rng.expovariate(rate)
        user = [rng.randrange(vocab) for _ in range(rng.randint(*user_len))]
        out.append(Client(t, rng.choice(prompts), [user], max_tokens))
    return out


def chat_trace(convs: int, turns: int, vocab: int, *, sys_len: tuple[int, int], user_len: tuple[int, int],
               max_tokens: int, seed: int = 1) -> list[Client]:
    rng = random.Random(seed)
    return [Client(0.0, [rng.randrange(vocab) for _ in range(rng.randint(*sys_len))],
                   [[rng.randrange(vocab) for _ in range(rng.randint(*user_len))] for _ in range(turns)],
                   max_tokens) for _ in range(convs)]


def time_prefix_cache(llm) -> dict:
    """Wrap the allocator's prefix-cache calls and the manager's hash chain with timers."""
    kv = llm.engine.scheduler.kv
    spent = {"ms": 0.0}

    def timed(fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent["ms"] += (time.perf_counter() - t) * 1e3
        return wrapper
    for name in ("lookup", "peek", "publish"):
        setattr(kv.allocator, name, timed(getattr(kv.allocator, name)))
    kv._block_hashes = timed(kv._block_hashes)
    return spent


def run_trace(llm, clients: list[Client], sync) -> dict:
    """Drive the engine: add each client's first turn at its arrival, its next turn when the
    previous one finishes; collect TTFT, hit counts and token counts."""
    from toolkit import SamplingParams
    from toolkit.engine.gc_freeze import frozen_heap

    eng = llm.engine
    pending = sorted(range(len(clients)), key=lambda i: clients[i].arrival)
    owner: dict[str, tuple[int, int]] = {}             # request id -> (client, turn)
    ttft, prompt_toks, cached, out_toks = [], 0, 0, 0

    def send(ci: int, turn: int) -> None:
        nonlocal prompt_toks
        c = clients[ci]
        c.history = (c.history or list(c.system)) + c.turns[turn]
        prompt_toks += len(c.history)
        rid = eng.add_request(list(c.history), SamplingParams(temperature=0, max_tokens=c.max_tokens,
                                                              ignore_eos=True))
        owner[rid] = (ci, turn)

    sync()
    t0 = time.perf_counter()
    with frozen_heap():     # as LLM.generate: no full GC pass inside a step
        while pending or owner:
            now = time.perf_counter() - t0
            while pending and clients[pending[0]].arrival <= now:
                send(pending.pop(0), 0)
            if not eng.has_unfinished():
                if not pending:
                    raise RuntimeError(f"{len(owner)} requests never reported a finish")
                time.sleep(max(0.0, clients[pending[0]].arrival - now))
                continue
            for o in eng.step():
                if not o.finished:
                    continue
                ci, turn = owner.pop(o.request_id)
                ttft.append(o.metrics.time_to_first_token)
                cached += o.metrics.num_cached_tokens
                toks = o.outputs[0].token_ids
                out_toks += len(toks)
                clients[ci].history += toks
                if turn + 1 < len(clients[ci].turns):
                    send(ci, turn + 1)
    sync()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(ttft, n=100) if len(ttft) > 1 else ttft * 99
    return dict(requests=len(ttft), prompt_tokens=prompt_toks, cached_tokens=cached,
                hit_rate=cached / prompt_toks, output_tokens=out_toks, wall_s=wall,
                output_tok_s=out_toks / wall, total_tok_s=(prompt_toks + out_toks) / wall,
                ttft_mean_ms=1e3 * statistics.fmean(ttft), ttft_p50_ms=1e3 * statistics.median(ttft),
                ttft_p99_ms=1e3 * q[98], steps=eng.num_steps)


def host_cost(clients: list[Client], block_size: int = 16) -> dict:
    """Host microseconds per request of the prefix cache alone (no model), each the best of
    5 passes (the CPU may be shared): `hashing` = the manager's hash chain of a prompt (both
    caches pay it), then per allocator the lookup, allocate, publish and free of each first
    turn through a KVCacheManager whose pool never evicts."""
    from toolkit import SamplingParams
    from toolkit.registry import lookup
    from toolkit.schedulers.kv_cache_manager import KVCacheManager
    from toolkit.types import Request

    prompts = [c.system + c.turns[0] for c in clients]
    need = sum(-(-len(p) // block_size) for p in prompts)
    best: dict[str, float] = {}
    # built once (a Request checks every token id, which would dominate); each pass resets them
    reqs = [Request(f"h{i}", p, SamplingParams(max_tokens=1)) for i, p in enumerate(prompts)]
    for _ in range(5):
        for label in ("hash_chain", "radix"):
            kv = KVCacheManager(lookup("allocator", ALLOCATORS[label])(need, block_size),
                                block_size=block_size, enable_prefix_caching=True)
            for r in reqs:
                r.num_computed_tokens = 0
            t = time.perf_counter()
            for r in reqs:
                kv._block_hashes(r, r.num_tokens // block_size)
            best["hashing"] = min(best.get("hashing", float("inf")), time.perf_counter() - t)
            t = time.perf_counter()
            for r in reqs:
                hits = kv.computed_blocks(r)
                kv.allocate_slots(r, r.num_tokens, hits=hits)
                r.num_computed_tokens = r.num_tokens
                kv.publish(r)
                kv.free(r)
                kv.forget(r.request_id)
            best[label] = min(best.get(label, float("inf")), time.perf_counter() - t)
    return {f"{k}_us_per_request": v / len(prompts) * 1e6 for k, v in best.items()} | {
        "blocks_per_request": need / len(prompts)}


def build(args, label: str):
    from toolkit import LLM

    allocator = ALLOCATORS.get(label) or TIERED[label]
    tier = dict(cpu_cache_gb=args.cpu_cache_gb) if label in TIERED else {}
    if tier and args.small:
        tier = dict(host_cache_blocks=args.host_cache_blocks)
    if args.small:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                          num_key_value_heads=2, vocab_size=517, max_position_embeddings=2048,
                          eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
        kw = dict(dtype="float32", device="cpu", max_num_seqs=32, max_num_batched_tokens=1024)
    else:
        from toolkit.models.shapes import llama31_8b

        cfg = llama31_8b()
        kw = dict(dtype="bfloat16", max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192,
                  gpu_memory_utilization=args.kv_fraction)
    if args.num_blocks:
        kw["num_blocks"] = args.num_blocks
    return LLM(cfg, allocator=allocator, enable_prefix_caching=allocator != "free_list",
                    max_model_len=args.max_model_len, **kw, **tier)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny random Llama on the CPU, small traces")
    ap.add_argument("--quick", action="store_true", help="--small with a 40-block pool and 8 conversations, comparing "
                    "hash_chain, hash_chain+cpu and radix+cpu (the CPU tier's check)")
    ap.add_argument("--cpu-cache-gb", type=float, default=16.0, help="host tier size of the +cpu allocators")
    ap.add_argument("--host-cache-blocks", type=int, default=256, help="host tier size with --small")
    ap.add_argument("--num", type=int, default=None, help="shared trace: requests (GPU default 500)")
    ap.add_argument("--rate", type=float, default=0.0, help="shared trace: requests / s (0: all at t=0)")
    ap.add_argument("--convs", type=int, default=None, help="chat trace: conversations (GPU default 48)")
    ap.add_argument("--turns", type=int, default=None, help="chat trace: turns each (GPU default 6)")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help=f"of {list(ALLOCATORS)}")
    ap.add_argument("--traces", default="shared,chat")
    ap.add_argument("--num-blocks", type=int, default=None, help="KV pool size (default: from memory)")
    ap.add_argument("--kv-fraction", type=float, default=0.6)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.small = True
        args.num_blocks = args.num_blocks or 40
        args.convs = args.convs or 8
        if args.allocators == ",".join(ALLOCATORS):
            args.allocators = "hash_chain,hash_chain+cpu,radix+cpu"
    for a in args.allocators.split(","):
        if a not in ALLOCATORS and a not in TIERED:
            ap.error(f"unknown allocator {a!r}; valid: {list(ALLOCATORS) + list(TIERED)}")
    small = args.small
    args.max_model_len = 1024 if small else 8192
    vocab = 517 if small else 128256
    sys_len, user_len, out_len = ((64, 128), (4, 12), 8) if small else ((1000, 2000), (20, 100), 32)
    num = args.num or (24 if small else 500)
    convs, turns = args.convs or (4 if small else 48), args.turns or (3 if small else 6)
    cuda = torch.cuda.is_available() and not small
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def traces() -> dict[str, list[Client]]:
        out = {}
        if "shared" in args.traces:
            out["shared"] = shared_trace(num, vocab, systems=20 if not small else 4, sys_len=sys_len,
                                         user_len=user_len, max_tokens=out_len, rate=args.rate)
        if "chat" in args.traces:
            out["chat"] = chat_trace(convs, turns, vocab, sys_len=(sys_len[0] // 2, sys_len[1] // 2),
                                     user_len=user_len, max_tokens=out_len * 2)
        return out

    results = dict(device=torch.cuda.get_device_name() if cuda else "cpu", date=time.strftime("%Y-%m-%d"),
                   shape="tiny-llama" if small else "llama3.1-8b", args=vars(args), runs=[])
    # the host cost at the GPU trace's prompt lengths, whatever the mode (no model involved)
    results["host"] = host_cost(shared_trace(200, vocab, systems=20, sys_len=(1000, 2000), user_len=(20, 100),
                                             max_tokens=1, rate=0.0))
    print("prefix cache alone, host us per 1-2k-token request: "
          + ", ".join(f"{k} {v:.0f}" for k, v in results["host"].items()), flush=True)
    for label in args.allocators.split(","):
        t = time.perf_counter()
        llm = build(args, label)
        startup = time.perf_counter() - t
        from toolkit import SamplingParams
        llm.generate([[1] * 300, [2] * 20], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                     use_tqdm=False)                   # warm-up outside the timings
        spent = time_prefix_cache(llm)
        host = llm.engine.scheduler.kv.host
        for name, clients in traces().items():
            spent["ms"] = 0.0
            before = (host.num_stored, host.num_loaded) if host is not None else (0, 0)
            r = run_trace(llm, clients, sync)
            r.update(trace=name, allocator=label, startup_s=startup, prefix_cache_host_ms=spent["ms"],
                     num_blocks=llm.engine.allocator.num_blocks)
            tier = ""
            if host is not None:
                bs = llm.engine.allocator.block_size
                r.update(host_slots=host.num_slots, host_blocks_stored=host.num_stored - before[0],
                         host_blocks_loaded=host.num_loaded - before[1])
                r["host_hit_rate"] = r["host_blocks_loaded"] * bs / r["prompt_tokens"]
                tier = (f"  host: {r['host_blocks_stored']} stored, {r['host_blocks_loaded']} loaded "
                        f"({r['host_hit_rate']:.1%} of prompt tokens)")
            results["runs"].append(r)
            print(f"[{name:6s} {label:14s}] hit {r['hit_rate']:6.1%}  TTFT mean {r['ttft_mean_ms']:8.1f} ms "
                  f"p99 {r['ttft_p99_ms']:8.1f} ms  {r['output_tok_s']:8.0f} out tok/s  "
                  f"{r['total_tok_s']:8.0f} tot tok/s  {r['wall_s']:6.1f} s  "
                  f"prefix-cache host {r['prefix_cache_host_ms']:7.1f} ms{tier}", flush=True)
        llm.close()
        del llm
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        if args.out:                                   # after each allocator: a timeout keeps the rest
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
