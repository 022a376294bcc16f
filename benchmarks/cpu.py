"""The embedded model on the CPU: LLM.generate against Hugging Face `generate`, in one process.

Same weights (the embedded SmolLM2-135M-Instruct folder, `default_model_path()`), float32,
greedy, the same chat prompts. Each repeat times the toolkit and then HF on the same inputs
(alternating, so load from the rest of the machine falls on both); medians are reported.
Cases: (a) one prompt, (b) 8 prompts at once (HF: one left-padded batch). Two length modes:
  "eos"   up to 64 new tokens, stopping at EOS (what a user runs); tokens = tokens emitted up
          to and including EOS (HF's padding after a row's EOS is not counted);
  "fixed" exactly 64 new tokens per prompt (toolkit: ignore_eos; HF: eos_token_id=None).
The ratio of medians and the median of the per-repeat ratios (each repeat's two runs are
back to back, so on a shared machine their ratio is the steadier figure) are both reported.
Greedy token ids are compared between the two ("same tokens" in the table). Also: the time to
first token of the README's example (a fresh `LLM()`, one chat request), and LLM()'s start-up.

    python -m benchmarks cpu --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

QUESTIONS = [
    "What is a KV cache?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Explain gravity in one sentence.",
    "Who wrote Hamlet?",
    "List four fruits.",
    "Why is the sky blue?",
]


def chat_prompts(tok) -> list[list[int]]:
    from toolkit.models import apply_chat_template

    return [tok(apply_chat_template(tok, [{"role": "user", "content": q}]), add_special_tokens=False)
            ["input_ids"] for q in QUESTIONS]


def run_toolkit(llm, prompts: list[list[int]], max_new: int, fixed: bool) -> tuple[float, list[list[int]]]:
    from toolkit import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=fixed)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    return dt, [list(o.outputs[0].token_ids) for o in outs]


def run_hf(hf, tok, prompts: list[list[int]], max_new: int, fixed: bool, eos: int) -> tuple[float, list[list[int]]]:
    batch = tok.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt")
    stop = None if fixed else eos
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(**batch, max_new_tokens=max_new, do_sample=False, eos_token_id=stop,
                          pad_token_id=eos, temperature=None, top_p=None, top_k=None)
    dt = time.perf_counter() - t
    rows = out[:, batch["input_ids"].shape[1]:].tolist()
    if not fixed:                                     # a row's tokens end at its first EOS
        rows = [r[: r.index(eos) + 1] if eos in r else r for r in rows]
    return dt, rows


def readme_ttft() -> dict[str, float]:
    """The README's example, as a new user runs it: LLM() then one chat request."""
    from toolkit import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(scheduler="continuous", allocator="prefix_caching", attention="auto", block_size=16,
              max_num_seqs=64)
    startup = time.perf_counter() - t
    with llm:
        outs = llm.chat([{"role": "user", "content": "What is a KV cache?"}],
                        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=64, seed=0), use_tqdm=False)
    return {"llm_startup_s": startup, "time_to_first_token_s": outs[0].time_to_first_token,
            "tokens": len(outs[0].outputs[0].token_ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--modes", default="eos,fixed")
    ap.add_argument("--out", default="benchmarks/results/cpu.json")
    ap.add_argument("--toolkit-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the toolkit's weights and activations (HF stays float32, its default for "
                         "this model); bfloat16 changes greedy tokens (same_tokens says by how much)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from toolkit import LLM
    from toolkit.models import default_model_path, load_tokenizer

    ttft = readme_ttft()
    path = default_model_path()
    tok = load_tokenizer(path)
    prompts = chat_prompts(tok)
    llm = LLM(path, dtype=args.toolkit_dtype, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    eos = llm.engine.eos_token_id
    run_toolkit(llm, prompts[:2], 4, False)           # warm both (allocations, first calls)
    run_hf(hf, tok, prompts[:2], 4, False, eos)

    rows = []
    for mode in args.modes.split(","):
        for n in (1, 8):
            ps, fixed = prompts[:n], mode == "fixed"
            ours, theirs, same = [], [], True
            for _ in range(args.repeats):
                dt, toks = run_toolkit(llm, ps, args.max_new, fixed)
                ours.append(sum(map(len, toks)) / dt)
                dt_hf, toks_hf = run_hf(hf, tok, ps, args.max_new, fixed, eos)
                theirs.append(sum(map(len, toks_hf)) / dt_hf)
                same &= toks == toks_hf
            row = {"mode": mode, "prompts": n, "toolkit_tok_s": statistics.median(ours),
                   "hf_tok_s": statistics.median(theirs), "toolkit_runs": ours, "hf_runs": theirs,
                   "tokens": sum(map(len, toks)), "same_tokens": same}
            row["ratio"] = row["toolkit_tok_s"] / row["hf_tok_s"]
            # each pair ran back to back: on a shared machine its ratio is steadier than the medians'
            row["pair_ratios"] = [a / b for a, b in zip(ours, theirs)]
            row["median_pair_ratio"] = statistics.median(row["pair_ratios"])
            rows.append(row)
            write(args.out, rows, args, ttft)                 # after each row: a partial run keeps its rows
            print(f"{mode:5s} {n} prompt(s): toolkit {row['toolkit_tok_s']:7.1f} tok/s  "
                  f"HF {row['hf_tok_s']:7.1f} tok/s  ratio {row['ratio']:.2f} (pairs {row['median_pair_ratio']:.2f})  "
                  f"({row['tokens']} tokens, same tokens: {same})", flush=True)
    llm.close()
    print(f"README example: LLM() {ttft['llm_startup_s']:.2f} s, time to first token "
          f"{ttft['time_to_first_token_s'] * 1e3:.0f} ms")
    write(args.out, rows, args, ttft)


def write(path: str, rows: list[dict], args: argparse.Namespace, ttft: dict[str, float]) -> None:
    result = {"benchmark": "cpu", "model": "SmolLM2-135M-Instruct (embedded)",
              "toolkit_dtype": args.toolkit_dtype, "hf_dtype": "float32",
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu": platform.processor() or platform.machine(), "repeats": args.repeats,
              "max_new_tokens": args.max_new, "rows": rows, "readme_example": ttft}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
