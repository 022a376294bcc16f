"""The figures of a benchmark's own output, for its record (benchmarks without an
extractor here keep their output under the record's `raw` and no figures)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.record import figure


def _throughput(raw: dict) -> list[dict]:
    tk = raw["toolkit"]["all"]["tok_s"]
    hf = raw.get("hf") or {}
    config = {"workload": raw.get("workload")}
    if hf.get("tok_s"):
        return [figure("offline throughput", tk, "tok/s", peer="Hugging Face continuous batching",
                       peer_value=hf["tok_s"], config=config)]
    return [figure("offline throughput", tk, "tok/s", config=config)]


def _cpu(raw: dict) -> list[dict]:
    return [figure(f"embedded model, {r['prompts']} prompt(s), mode {r['mode']}", r["toolkit_tok_s"], "tok/s",
                   peer="Hugging Face generate", peer_value=r["hf_tok_s"],
                   config={"mode": r["mode"], "prompts": r["prompts"]}) for r in raw["rows"]]


def _serving(raw: dict) -> list[dict]:
    base = raw["generate"]["output_tok_s"]
    out = []
    for loop in ("thread", "process"):
        for path, runs in (raw.get(loop) or {}).items():
            for rate, r in runs.items():
                out.append(figure(f"{path}, engine on a {loop}, rate {rate}", r["output_tok_s"], "tok/s",
                                  peer="LLM.generate", peer_value=base,
                                  config={"engine": loop, "path": path, "rate": rate}))
    return out


def _pct(row: dict, ms: float) -> float:
    """The share of the copy bandwidth that moving the row's bytes in `ms` is."""
    return round(row["bytes"] / (ms * 1e-3) / row["copy_bw"] * 100, 1)


def _attention(raw: dict) -> list[dict]:
    """Decode: % of copy bandwidth against cuDNN (timed as a model's layers when the run did
    that, else one flushed call); prefill and cached-prefix chunks: TFLOP/s against cuDNN."""
    out = []
    for r in raw.get("decode", []):
        layers = "toolkit_layers_ms" in r
        ms, peer = ((r["toolkit_layers_ms"], r["peers_layers_ms"]) if layers else (r["toolkit_ms"], r["peers_ms"]))
        if "cudnn" not in peer:
            continue
        out.append(figure(f"decode, {r['model']}, batch {r['batch']} x {r['ctx']} keys", _pct(r, ms),
                          "% of copy bandwidth", peer="torch SDPA (cuDNN)", peer_value=_pct(r, peer["cudnn"]),
                          config={"model": r["model"], "batch": r["batch"], "keys": r["ctx"],
                                  "timing": "layers" if layers else "one call"}))
    for part in ("prefill", "prefix_prefill"):
        for r in raw.get(part, []):
            if "cudnn" not in r.get("peers_tflops", {}):
                continue
            shape = (f"{r['batch']} x {r['seq']}" if part == "prefill"
                     else f"{r['batch']} x ({r['prefix']} cached + {r['chunk']})")
            out.append(figure(f"{part.replace('_', ' ')}, {r['model']}, {shape}", round(r["toolkit_tflops"], 1),
                              "TFLOP/s", peer="torch SDPA (cuDNN)", peer_value=round(r["peers_tflops"]["cudnn"], 1),
                              config={"model": r["model"], "batch": r["batch"]}))
    return out


def _moe(raw: dict) -> list[dict]:
    """The MoE layer's kernels as % of its roofline (the fused kernel against the per-expert
    loop and torch's grouped GEMM; on a CPU run, grouped GEMM against the loop), the decode step
    in ms against its roofline's, and ShareGPT tok/s against Hugging Face."""
    out, shape = [], raw["shape"]
    config = {"shape": shape, "toy": bool(raw.get("toy"))}
    for r in raw.get("kernel", []):
        share = {n: round(100 * v, 1) for n, v in r["share"].items()}
        mine = "fused" if "fused" in share else "grouped_mm"
        for peer in ("loop", "grouped_mm"):
            if peer != mine and peer in share:
                out.append(figure(f"MoE layer {mine}, {shape}, {r['tokens']} tokens", share[mine], "% of roofline",
                                  peer={"loop": "per-expert loop", "grouped_mm": "torch._grouped_mm"}[peer],
                                  peer_value=share[peer], config={**config, "tokens": r["tokens"]}))
    for r in raw.get("decode", []):
        out.append(figure(f"decode step, {shape}, batch {r['batch']} x {r['context']}", round(r["measured_ms"], 3),
                          "ms", peer="roofline", peer_value=round(r["floor_ms"], 3),
                          config={**config, "batch": r["batch"], "context": r["context"]}))
    tput = raw.get("sharegpt")
    if tput and tput.get("hf"):
        tk = tput["toolkit"].get("hf_subset", tput["toolkit"]["all"])
        out.append(figure(f"output throughput, {shape}, {tput['workload']}", round(tk["tok_s"], 1), "tok/s",
                          peer=f"Hugging Face ({tput['hf']['requests']} requests)",
                          peer_value=round(tput["hf"]["tok_s"], 1), config=config))
    return out


def _embed(raw: dict) -> list[dict]:
    return [figure(f"embeddings, {raw['model']}, {raw['texts']} texts", round(raw["toolkit_emb_s"], 1),
                   "embeddings/s", peer="sentence-transformers", peer_value=round(raw["st_emb_s"], 1),
                   config={"model": raw["model"], "texts": raw["texts"], "st_batch_size": raw["st_batch_size"]})]


EXTRACTORS: dict[str, Callable[[Any], list[dict]]] = {
    "throughput": _throughput, "cpu": _cpu, "serving": _serving, "attention": _attention, "moe": _moe,
    "embed": _embed}


def extract(name: str, raw: Any) -> list[dict]:
    fn = EXTRACTORS.get(name)
    return fn(raw) if fn is not None and raw is not None else []
