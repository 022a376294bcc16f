"""The floor of an offline throughput workload: how fast an ideal engine could finish it.

A throughput figure alone does not say how far a run is from what the hardware allows. This
walks an offline workload (every request arrives at once; output lengths fixed, as with
ignore_eos) the way a continuous-batching engine runs it. Requests are admitted first come
first served up to max_num_seqs, and each admitted prompt is prefilled once. Then one decode step
gives every running request its next token, and a finished request frees its slot for the next
in line. Every op of every step is costed at its roofline, max(bytes / copy bandwidth, FLOPs /
matmul peak), with the op list of benchmarks/roofline.py:
- weights read once a step;
- the KV of every visible token read once a step;
- 2 FLOPs a weight a token, and 4 a query-key pair for attention (causal for prompts);
- the activations in and out of every op, small ops (norms, rotary, the KV write, SiLU) included.
A second figure keeps only the projections, the LM head and attention: the floor of an engine
that fused every other op away.

The sum is a lower bound for any engine that prefills an admitted prompt before its decodes, as
vLLM and this toolkit do (prompts admitted together share one weight read). The decode steps
alone are a bound even for an engine that hid every prefill inside them. A run's tok/s over
the floor's tok/s is its fraction of the hardware.

    python -m benchmarks floor --shape qwen3 --workload random --num 256 --max-num-seqs 256
    python -m benchmarks floor --shape llama8b --workload sharegpt --num 1000 --max-num-seqs 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import deque
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import roofline  # noqa: E402

# measured on the H200 (RESULTS, engine core: a 2 GiB device copy, bf16 8192^3 matmul)
H200_COPY_BW, H200_MATMUL = 4.2e12, 790e12


# the op kinds every engine must run: the projections and LM head, attention (KV read once);
# the rest (norms, rotary, the KV write, the activation, logits/embedding traffic) a fused
# engine could shrink, so `essential=True` leaves them out
ESSENTIAL = ("gemm", "attention")


def prefill_work(g: Any, prompts: list[int], act_bytes: int = 2,
                 kv_bytes: int = 2) -> dict[str, list[tuple[float, float]]]:
    """{kind: [(bytes, FLOPs) of each op]} of one step that prefills whole prompts of the
    given lengths together: the weights read once, causal attention within each prompt, the
    LM head for each prompt's last token (kinds as benchmarks/roofline.py's)."""
    t, b = sum(prompts), act_bytes
    q, kv, hid, inter = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, g.hidden, g.intermediate

    def gemm(n_in: int, n_out: int, rows: int = t) -> tuple[float, float]:
        return (n_in * n_out * b + rows * (n_in + n_out) * b, 2.0 * rows * n_in * n_out)

    pairs = sum(p * (p + 1) / 2 for p in prompts)             # causal query-key pairs
    n = g.num_layers
    return {
        "gemm": [gemm(hid, q + 2 * kv), gemm(q, hid), gemm(hid, 2 * inter), gemm(inter, hid)] * n
                + [gemm(hid, g.vocab_size, rows=len(prompts))],
        "attention": [(t * kv * 2 * kv_bytes + t * q * b * 2, 4.0 * pairs * q)] * n,
        "kv_write": [(t * kv * 2 * (b + kv_bytes), 0.0)] * n,
        # norms, rotary and the activation together (a decode step's norm / rotary / activation)
        "small": [(8.0 * t * hid * b + 2.0 * t * (q + kv) * b + 3.0 * t * inter * b, 0.0)] * n,
    }


def _ms(work: dict[str, list[tuple[float, float]]], copy_bw: float, matmul_flops: float,
        essential: bool, by_kind: dict[str, float] | None = None) -> float:
    """The floor (ms) of `work`; by_kind, when given, gets each kind's share added."""
    total = 0.0
    for kind, ops in work.items():
        if essential and kind not in ESSENTIAL:
            continue
        ms = roofline.floor_ms(ops, copy_bw, matmul_flops)
        total += ms
        if by_kind is not None:
            by_kind[kind] = by_kind.get(kind, 0.0) + ms
    return total


def workload_floor(g: Any, requests: list[tuple[int, int]], max_num_seqs: int,
                   copy_bw: float = H200_COPY_BW, matmul_flops: float = H200_MATMUL, *,
                   essential: bool = False) -> dict:
    """The floor of `requests` [(prompt tokens, output tokens)] on geometry g: seconds split
    into prefill and decode, decode steps, and output tokens per second. essential: only the
    ESSENTIAL kinds of op (what no fusion removes)."""
    bad = next(((i, r) for i, r in enumerate(requests) if r[0] < 1 or r[1] < 1), None)
    if bad is not None:
        raise ValueError(f"every request needs at least one prompt and one output token; request "
                         f"{bad[0]} is (prompt {bad[1][0]}, output {bad[1][1]})")
    waiting = deque(requests)
    running: list[list[int]] = []          # [context including the newest token, tokens still to make]
    prefill_ms = decode_ms = 0.0
    steps = 0
    by_kind: dict[str, float] = {}         # ms of floor per kind of op, prefill and decode together
    while waiting or running:
        admitted = []                      # admitted together: one prefill, makes token 1
        while waiting and len(running) + len(admitted) < max_num_seqs:
            admitted.append(waiting.popleft())
        if admitted:
            prefill_ms += _ms(prefill_work(g, [p for p, _ in admitted]), copy_bw, matmul_flops,
                              essential, by_kind)
            running += [[p + 1, o - 1] for p, o in admitted if o > 1]
        if not running:
            continue
        decode_ms += _ms(roofline.decode_step_work(g, [c for c, _ in running]), copy_bw,
                         matmul_flops, essential, by_kind)
        steps += 1
        running = [[c + 1, left - 1] for c, left in running if left > 1]
    seconds = (prefill_ms + decode_ms) / 1e3
    out_tokens = sum(o for _, o in requests)
    # the decode steps alone bound even an engine that hid every prefill inside them
    return dict(seconds=seconds, prefill_s=prefill_ms / 1e3, decode_s=decode_ms / 1e3,
                decode_steps=steps, output_tokens=out_tokens, tok_s=out_tokens / seconds,
                by_kind_s={k: v / 1e3 for k, v in by_kind.items()},
                decode_only_tok_s=out_tokens / (decode_ms / 1e3) if decode_ms else float("inf"))


def _workload(name: str, num: int, vocab: int, data: str) -> list[tuple[int, int]]:
    from benchmarks.throughput import random_workload, sharegpt_workload

    reqs = random_workload(num, vocab) if name == "random" else sharegpt_workload(data, num, vocab)
    return [(len(p), o) for p, o in reqs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3", help="qwen3 or llama8b")
    ap.add_argument("--workload", default="random", choices=["random", "sharegpt"],
                    help="random: nano-vllm's (lengths uniform in [100, 1024]); sharegpt: ShareGPT V3")
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--data", default="benchmarks/data/sharegpt.json")
    ap.add_argument("--copy-bw", type=float, default=H200_COPY_BW, help="bytes/s")
    ap.add_argument("--matmul-flops", type=float, default=H200_MATMUL, help="FLOP/s")
    ap.add_argument("--measured", type=float, nargs="*", default=[], help="tok/s of runs to put against it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from benchmarks.sim_common import model_config

    cfg = model_config(args.shape)
    reqs = _workload(args.workload, args.num, cfg.vocab_size, args.data)
    r = workload_floor(roofline.Geometry.of(cfg), reqs, args.max_num_seqs, args.copy_bw, args.matmul_flops)
    lean = workload_floor(roofline.Geometry.of(cfg), reqs, args.max_num_seqs, args.copy_bw, args.matmul_flops,
                          essential=True)
    r.update(essential={k: lean[k] for k in ("seconds", "prefill_s", "decode_s", "tok_s",
                                             "decode_only_tok_s")})
    r.update(shape=args.shape, workload=args.workload, num=args.num, max_num_seqs=args.max_num_seqs,
             copy_bw=args.copy_bw, matmul_flops=args.matmul_flops,
             measured={str(m): m / r["tok_s"] for m in args.measured})
    print(f"{args.shape}, {args.workload}-{args.num}, max_num_seqs {args.max_num_seqs}: floor "
          f"{r['seconds']:.2f} s (prefill {r['prefill_s']:.2f}, decode {r['decode_s']:.2f} over "
          f"{r['decode_steps']} steps) = {r['tok_s']:,.0f} output tok/s; the decode steps alone "
          f"{r['decode_only_tok_s']:,.0f}")
    e = r["essential"]
    print(f"  with only the projections, LM head and attention (every other op fused away): "
          f"{e['seconds']:.2f} s = {e['tok_s']:,.0f} tok/s; the decode steps alone {e['decode_only_tok_s']:,.0f}")
    for m, frac in r["measured"].items():
        print(f"  {float(m):,.0f} tok/s is {frac:.0%} of the floor, {float(m) / e['tok_s']:.0%} "
              "of the essential one")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
