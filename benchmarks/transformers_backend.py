"""The Transformers backend beside the native model file: the same shape, random weights,
the same engine settings, one process (issue 43 item 4: "say what it costs").

For each implementation ("native": toolkit's LlamaForCausalLM via load_model; "transformers":
TransformersForCausalLM via load_transformers_model) an LLM is built, warmed, and timed on
- prefill: `--prefill-prompts` prompts of `--prefill-len` tokens, max_tokens=1 (prompt tok/s);
- decode: `--decode-prompts` prompts of `--decode-len` tokens, `--decode-tokens` new tokens each
  (output tok/s, wall time dominated by decode steps).
CUDA graphs are asked for; if the engine cannot capture the transformers modules, that
implementation is rebuilt with cuda_graphs=False and the error is recorded. The ratio
transformers / native of each figure is the cost.

    python -m benchmarks transformers_backend --shape llama8b
    python -m benchmarks transformers_backend --shape tiny       # the CPU: a check of the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks.sim_common import model_config, release_llm

GPU = dict(dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.85,
           max_model_len=4096)
CPU = dict(dtype="float32", device="cpu", num_blocks=512, max_num_seqs=16, max_num_batched_tokens=256,
           max_model_len=1024)


def build(impl: str, shape: str, settings: dict[str, Any], cuda_graphs: bool) -> Any:
    from toolkit import LLM
    from toolkit.models.transformers_backend import load_transformers_model

    config = model_config(shape)
    if impl == "native":
        return LLM(config, cuda_graphs=cuda_graphs, **settings)
    dtype = getattr(torch, settings["dtype"])
    device = settings.get("device", "cuda")
    model = load_transformers_model(config, dtype=dtype, device=device)
    return LLM(model, cuda_graphs=cuda_graphs, **settings)


def timed(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    from toolkit import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def measure(impl: str, args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"impl": impl}
    cuda_graphs = settings.get("device") != "cpu"
    try:
        llm = build(impl, args.shape, settings, cuda_graphs)
        row["cuda_graphs"] = cuda_graphs
    except Exception as e:  # noqa: BLE001 -- recorded, then the eager engine is measured
        row["cuda_graphs"], row["cuda_graphs_error"] = False, f"{type(e).__name__}: {e}"[:300]
        llm = build(impl, args.shape, settings, False)
    vocab = llm.engine.model.spec.vocab_size
    rng = random.Random(0)
    prompt = lambda n: [rng.randrange(3, vocab) for _ in range(n)]
    try:
        timed(llm, [prompt(args.decode_len) for _ in range(4)], 8)                    # warm-up
        s, _ = timed(llm, [prompt(args.prefill_len) for _ in range(args.prefill_prompts)], 1)
        row["prefill_tok_s"] = args.prefill_prompts * args.prefill_len / s
        s, n = timed(llm, [prompt(args.decode_len) for _ in range(args.decode_prompts)], args.decode_tokens)
        row["decode_output_tok_s"], row["decode_wall_s"] = n / s, s
    finally:
        release_llm(llm)
    print(f"{impl:12s} graphs={row['cuda_graphs']!s:5s} prefill {row['prefill_tok_s']:10.0f} tok/s  "
          f"decode {row['decode_output_tok_s']:9.0f} output tok/s", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama8b", choices=["llama8b", "qwen3", "tiny"])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"),
                                                  "transformers_backend.json"))
    ap.add_argument("--prefill-prompts", type=int, default=None)
    ap.add_argument("--prefill-len", type=int, default=None)
    ap.add_argument("--decode-prompts", type=int, default=None)
    ap.add_argument("--decode-len", type=int, default=None)
    ap.add_argument("--decode-tokens", type=int, default=None)
    args = ap.parse_args()
    tiny = args.shape == "tiny"
    for name, gpu, cpu in (("prefill_prompts", 32, 4), ("prefill_len", 1024, 96), ("decode_prompts", 128, 8),
                           ("decode_len", 128, 16), ("decode_tokens", 256, 16)):
        if getattr(args, name) is None:
            setattr(args, name, cpu if tiny else gpu)
    settings = CPU if tiny else GPU
    if tiny:
        torch.set_num_threads(1)
    start = time.time()
    rows = [measure(impl, args, settings) for impl in ("native", "transformers")]
    ratio = {k: rows[1][k] / rows[0][k] for k in ("prefill_tok_s", "decode_output_tok_s")}
    print("transformers / native: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    res = {"benchmark": "transformers_backend", "shape": args.shape,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not tiny else "cpu",
           "torch": torch.__version__, "settings": settings,
           "workload": {k: getattr(args, k) for k in ("prefill_prompts", "prefill_len", "decode_prompts",
                                                      "decode_len", "decode_tokens")},
           "rows": rows, "transformers_over_native": ratio, "wall_s": time.time() - start}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
