"""Speculative decoding's machinery on the GPU: decode tokens/s with an oracle proposer of set
acceptance rate vs speculation off, same run, same prompts, Qwen3-0.6B-shaped random weights.

Random weights make a real draft's acceptance meaningless, so the speculation-off run records
each prompt's greedy output and `OracleProposer` proposes it right with probability a per
position (a = 0.3, 0.6, 0.9). Decode tokens/s = generated tokens / wall seconds of a greedy
run with short prompts (prefill is a small share). Target (issue 7): batch 1, a = 0.9, k = 4
-> >= 2.5x speculation off.

    python -m benchmarks speculative
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

import torch

from toolkit.models.shapes import qwen3_0_6b


def make_llm(cfg, args, proposer=None, k: int = 0):
    from toolkit import LLM

    spec = {} if proposer is None else dict(proposer=proposer, num_speculative_tokens=k)
    llm = LLM(cfg, dtype=args.dtype, attention="triton", max_num_seqs=max(args.batches),
              gpu_memory_utilization=args.kv_fraction, enable_prefix_caching=False,
              max_model_len=args.prompt_len + args.output_len + 16, **spec)
    # Random weights give flat logits whose argmax flips between a one-token decode and a
    # (1+k)-token verification in bf16 (scaling the logits does not help: the gap between the
    # top two scales with them). Scaling the tied embedding makes the residual stream carry
    # the input token far above the layers' random output, so the argmax is that token by a
    # wide margin: greedy output repeats the prompt's last token, and bf16 cannot flip it.
    # The work per step (every layer, attention over the whole context) is unchanged.
    llm.engine.model.model.embed_tokens.weight.data.mul_(args.embed_scale)
    return llm


def timed_generate(llm, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]]]:
    from toolkit import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    # warm up on the same prompts: with drafts, every step's token count depends on how many
    # were accepted, and each new count can compile kernel variants (seconds each) the first time
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max(4, output_len // 4),
                                         ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, [list(o.token_ids) for o in outs]


def close(llm) -> None:
    llm.engine.close()
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.3, 0.6, 0.9])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--embed-scale", type=float, default=64.0,
                    help="scale of the tied embedding (1 = the random model as drawn)")
    ap.add_argument("--warmup-gpu", type=float, default=3.0,
                    help="seconds of matrix products first: a fresh GPU runs at idle clocks")
    ap.add_argument("--kv-fraction", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/speculative.py needs a CUDA device")
    from toolkit.samplers.speculative.oracle import OracleProposer

    cfg = qwen3_0_6b()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t_end = time.perf_counter() + args.warmup_gpu
    while time.perf_counter() < t_end:       # bring the clocks up before the first timing
        (a @ a).sum().item()
    rng = random.Random(0)
    prompts = {b: [[rng.randrange(cfg.vocab_size) for _ in range(args.prompt_len)] for _ in range(b)]
               for b in args.batches}
    # speculation off: the baseline, and the futures the oracle proposes from
    llm = make_llm(cfg, args)
    base: dict[int, float] = {}
    futures: dict[tuple[int, ...], list[int]] = {}
    for b in args.batches:
        secs, outs = timed_generate(llm, prompts[b], args.output_len)
        base[b] = b * args.output_len / secs
        futures.update({tuple(p): o for p, o in zip(prompts[b], outs)})
    close(llm)

    rows = []
    for k in args.ks:
        for a in args.rates:
            oracle = OracleProposer(futures, a, seed=k)
            llm = make_llm(cfg, args, oracle, k)
            for b in args.batches:
                secs, outs = timed_generate(llm, prompts[b], args.output_len)
                same = sum(o == futures[tuple(p)] for p, o in zip(prompts[b], outs))
                tps = b * args.output_len / secs
                rows.append(dict(batch=b, k=k, acceptance=a, tokens_per_s=tps,
                                 speedup=tps / base[b], identical_outputs=f"{same}/{b}",
                                 misaligned_calls=oracle.num_misaligned))
            close(llm)

    print(f"{'batch':>5} {'k':>2} {'accept':>6} {'tok/s':>10} {'off tok/s':>10} {'speedup':>7} "
          f"{'same out':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['k']:>2} {r['acceptance']:>6.1f} {r['tokens_per_s']:>10.1f} "
              f"{base[r['batch']]:>10.1f} {r['speedup']:>6.2f}x {r['identical_outputs']:>8}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), baseline_tokens_per_s=base, rows=rows,
                           device=torch.cuda.get_device_name()), f, indent=1)


if __name__ == "__main__":
    main()
