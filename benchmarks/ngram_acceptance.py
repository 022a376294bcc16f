"""Real acceptance of n-gram (prompt lookup) drafts on an input-copying task, embedded SmolLM2
on the CPU: greedy, k = 1..6; also checks the output equals speculation off.

    python -m benchmarks ngram_acceptance
"""

from __future__ import annotations

import time

from toolkit import LLM, SamplingParams

TEXT = ("Paged attention stores the key and value cache in fixed-size blocks, so memory is "
        "allocated on demand and shared between requests with a common prefix. The scheduler "
        "grants each request tokens every step until its computed tokens catch up.")
TASKS = [f"Repeat this text exactly: {TEXT}", f"Fix the grammar of this text and return it: {TEXT}"]


def main() -> None:
    params = SamplingParams(temperature=0, max_tokens=64)
    msgs = [[{"role": "user", "content": t}] for t in TASKS]
    base = None
    print(f"{'k':>2} {'drafted':>8} {'accepted':>8} {'rate':>6} {'tokens/forward':>14} {'wall s':>7} same")
    for k in (0, 1, 2, 4, 6):
        kw = dict(speculative="ngram", num_speculative_tokens=k) if k else {}
        with LLM(max_num_seqs=1, **kw) as llm:
            t0 = time.perf_counter()
            outs = [o.token_ids for o in llm.chat(msgs, params, use_tqdm=False)]
            dt = time.perf_counter() - t0
            e = llm.engine
            n = sum(len(o) for o in outs)
            base = outs if base is None else base
            rate = e.spec_accepted / max(e.spec_drafted, 1)
            print(f"{k:>2} {e.spec_drafted:>8} {e.spec_accepted:>8} {rate:>6.2f} "
                  f"{n / max(e.num_steps - 2, 1):>14.2f} {dt:>7.1f} {outs == base}")


if __name__ == "__main__":
    main()
