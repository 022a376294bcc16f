"""Sample ShareGPT V3 requests the way vLLM's throughput benchmark does, on the CPU.

seed 0; the first two turns of conversations with at least two; prompt and reference
answer tokenized with a real tokenizer (default: the embedded SmolLM2's); pruned when
either is shorter than 4 tokens, the prompt is longer than 1024 or prompt + output longer
than 2048; output length = the reference answer's length. Writes
{"tokenizer": ..., "requests": [{"prompt_ids": [...], "output_len": n}, ...]} so the GPU
run needs neither the 125 MB dataset nor the tokenizer.

    python -m benchmarks.sharegpt_prep --num 1000 --out benchmarks/data/sharegpt.json
"""

from __future__ import annotations

import argparse
import json
import os


def sample(num: int, tokenizer, seed: int = 0) -> list[dict]:
    from toolkit.simulator.sharegpt import sample_sharegpt

    return sample_sharegpt(num, tokenizer, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--out", default="benchmarks/data/sharegpt.json")
    args = ap.parse_args()
    from toolkit.models import default_model_path, load_tokenizer

    path = default_model_path()
    tok = load_tokenizer(path)
    reqs = sample(args.num, tok)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"tokenizer": "SmolLM2-135M-Instruct (embedded)", "vocab_size": len(tok),
                   "requests": reqs}, f)
    n_in = sum(len(r["prompt_ids"]) for r in reqs)
    n_out = sum(r["output_len"] for r in reqs)
    print(f"{len(reqs)} requests, {n_in} prompt tokens, {n_out} output tokens -> {args.out}")


if __name__ == "__main__":
    main()
