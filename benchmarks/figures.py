"""The figures of a benchmark's own output, for its record (benchmarks without an
extractor here keep their output under the record's `raw` and no figures)."""

from __future__ import annotations

from typing import Any, Callable

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


EXTRACTORS: dict[str, Callable[[Any], list[dict]]] = {
    "throughput": _throughput, "cpu": _cpu, "serving": _serving}


def extract(name: str, raw: Any) -> list[dict]:
    fn = EXTRACTORS.get(name)
    return fn(raw) if fn is not None and raw is not None else []
