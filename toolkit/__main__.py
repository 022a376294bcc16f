"""`python -m toolkit "prompt" ...`: chat with the default pipeline on the embedded model."""

from __future__ import annotations

import argparse
import logging


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m toolkit", description=__doc__)
    ap.add_argument("prompts", nargs="*", default=["What is paged attention, in one sentence?",
                                                    "Write a haiku about GPUs."])
    ap.add_argument("--model", default=None, help="local Hugging Face folder (default: embedded SmolLM2)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--scheduler", default="continuous")
    ap.add_argument("--attention", default="auto")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    from toolkit import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    with LLM(args.model, scheduler=args.scheduler, attention=args.attention) as llm:
        print(llm)
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
        for p, o in zip(args.prompts, outs):
            m = o.metrics
            ttft = f"{o.time_to_first_token * 1e3:.0f} ms" if m and m.first_token_time else "-"
            print(f"\n>>> {p}\n{o.text}\n[{len(o.token_ids)} tokens, {o.finish_reason}, TTFT {ttft}]")


if __name__ == "__main__":
    main()
