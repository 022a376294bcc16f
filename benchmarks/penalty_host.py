"""Host time of one step's SamplingMetadata when every row is penalised: the token lists
rebuilt from the host each step (SamplingMetadata.build alone) against PenaltyHistory (the
engine's default: rows kept on the device, only new tokens uploaded).

Device work runs on PyTorch's "meta" device, which costs the host nothing, as work queued on
a GPU stream does; the list path's copy into pinned memory and its transfer (3 MB a step at
batch 256 with 1500 tokens a row) are not counted, so its real cost on a GPU is higher than shown.

    python -m benchmarks penalty_host
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from toolkit.worker.penalty_history import PenaltyHistory
from toolkit.samplers.base import SamplingMetadata
from toolkit.types import Request, SamplingParams

VOCAB = 151936          # Qwen3's


def time_build(batch: int, prompt: int, output: int, history: bool, steps: int = 30) -> float:
    """Median seconds of a step's metadata build, after `output` tokens, one more a step."""
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.7, repetition_penalty=1.1)
    reqs = []
    for i in range(batch):
        r = Request(request_id=str(i), prompt_token_ids=rng.integers(0, VOCAB, prompt).tolist(),
                    sampling_params=params)
        r.output_token_ids.extend(rng.integers(0, VOCAB, output).tolist())
        reqs.append(r)
    dev = torch.device("meta")
    hist = PenaltyHistory(VOCAB, dev, rows=batch + 1, width=max(prompt, output) * 2)

    def build():
        lists = ((lambda rows: hist.lists([reqs[i] for i in rows], [True] * len(rows))) if history else None)
        return SamplingMetadata.build([params] * batch, [r.prompt_array for r in reqs],
                                      [r.output_token_ids for r in reqs], VOCAB, dev, check_ids=False,
                                      penalty_lists=lists)

    build()                                     # the history uploads the prompts once
    times = []
    for _ in range(steps):
        for r in reqs:                          # a decode step: one token more each
            r.output_token_ids.append(int(rng.integers(0, VOCAB)))
        t = time.perf_counter()
        build()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for batch, prompt, output in [(64, 1000, 500), (256, 1000, 500), (256, 200, 100)]:
        lists, hist = time_build(batch, prompt, output, False), time_build(batch, prompt, output, True)
        rows.append({"batch": batch, "prompt": prompt, "output": output, "lists_ms": lists * 1e3,
                     "history_ms": hist * 1e3})
        print(f"batch {batch:4d}, prompt {prompt:5d}, output {output:4d}: lists rebuilt {lists * 1e3:6.2f} ms, "
              f"history {hist * 1e3:6.2f} ms ({lists / hist:.1f}x)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
