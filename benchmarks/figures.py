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


def _lora(raw: dict) -> list[dict]:
    """Per adapter count: output tok/s and the steady decode step, each against the base model
    built without LoRA (the first row, adapters None)."""
    rows = raw["rows"]
    base = next(r for r in rows if r["adapters"] is None)
    config = {"shape": raw["shape"], "rank": raw["rank"], "workload": raw.get("workload")}
    out = []
    for r in rows:
        if r["adapters"] is None:
            continue
        n = r["adapters"]
        label = f"{n} adapters" if n else "LoRA on, no adapter"
        out.append(figure(f"multi-LoRA output throughput, {label}", round(r["output_tok_per_s"], 1), "tok/s",
                          peer="base model without LoRA", peer_value=round(base["output_tok_per_s"], 1),
                          config={**config, "adapters": n}))
        if r["steady_decode_step_ms"] and base["steady_decode_step_ms"]:
            out.append(figure(f"multi-LoRA steady decode step, {label}", round(r["steady_decode_step_ms"], 3), "ms",
                              peer="base model without LoRA", peer_value=round(base["steady_decode_step_ms"], 3),
                              config={**config, "adapters": n}))
    return out


def _quant_gemm(raw: dict) -> list[dict]:
    """Per batch and scheme: a decoder layer's GEMMs (its projections summed) in us, against
    bf16 F.linear of the same shapes."""
    by_batch: dict[int, list[dict]] = {}
    for r in raw["rows"]:
        by_batch.setdefault(r["batch"], []).append(r)
    out = []
    for m, rows in sorted(by_batch.items()):
        schemes = [k for k in rows[0] if k not in ("batch", "proj", "n_in", "n_out", "bf16")
                   and not k.endswith(" floor")]
        if "bf16" not in rows[0]:
            continue
        bf16 = sum(r["bf16"] for r in rows)
        for s in schemes:
            out.append(figure(f"{s} GEMMs of a layer, {raw['shape']}, {m} tokens", round(sum(r[s] for r in rows), 2),
                              "us", peer="bf16 F.linear", peer_value=round(bf16, 2),
                              config={"shape": raw["shape"], "scheme": s, "batch": m,
                                      "projections": [r["proj"] for r in rows]}))
    return out


def _quant_fusion(raw: dict) -> list[dict]:
    """Per code dtype, batch and op: the fused norm / SiLU-and-mul + quantization in us against
    the unfused pair."""
    names = {"norm": "RMSNorm", "silu": "SiLU-and-mul"}
    return [figure(f"{names[op]} + {r['codes']} quant fused, {raw['shape']}, {r['batch']} tokens",
                   round(r[f"{op} fused"], 2), "us", peer="unfused pair", peer_value=round(r[f"{op} unfused"], 2),
                   config={"shape": raw["shape"], "codes": r["codes"], "batch": r["batch"], "op": op})
            for r in raw["rows"] for op in names if f"{op} fused" in r and f"{op} unfused" in r]


def _quant_decode(raw: dict) -> list[dict]:
    """Per scheme and batch: the steady decode step in ms against bf16's in the same process."""
    base = {r["batch"]: r["step_ms"] for r in raw["rows"] if r["scheme"] == "bf16"}
    return [figure(f"decode step, {r['scheme']} weights, {raw['shape']}, batch {r['batch']}", round(r["step_ms"], 3),
                   "ms", peer="bf16 weights", peer_value=round(base[r["batch"]], 3),
                   config={"shape": raw["shape"], "scheme": r["scheme"], "batch": r["batch"]})
            for r in raw["rows"] if r["scheme"] != "bf16" and r["batch"] in base]


def _cold_start(raw: dict) -> list[dict]:
    """Per shape: LLM(...) from an empty Triton cache with the kernels compiled in parallel,
    against one by one; and warm (the cache filled)."""
    out = []
    for row in raw["shapes"]:
        runs, config = row["runs"], {"shape": row["shape"], "workers": row["workers"], "cpus": row["cpus"]}
        out.append(figure(f"cold start, {row['shape']}, parallel compile", round(runs["cold_parallel"]["total_s"], 2),
                          "s", peer="compiles in turn", peer_value=round(runs["cold_in_turn"]["total_s"], 2),
                          config=config))
        out.append(figure(f"warm start, {row['shape']}", round(runs["warm"]["total_s"], 2), "s", config=config))
    return out


def _sleep_mode(raw: dict) -> list[dict]:
    """Per level: sleep then wake (weights and KV cache) in s against building a new LLM; then
    update_weights' GB/s from host and from device tensors."""
    config = {"shape": raw["shape"]}
    out = []
    for level, r in sorted(raw["levels"].items()):
        total = r["sleep_s"] + r["wake_weights_s"] + r["wake_kv_s"]
        out.append(figure(f"sleep + wake, level {level}, {raw['shape']}", round(total, 3), "s",
                          peer="a new LLM", peer_value=round(raw["build_s"], 3), config={**config, "level": int(level)}))
    u = raw["update"]
    for src in ("host", "device"):
        out.append(figure(f"update_weights from {src}, {raw['shape']}", round(u[f"from_{src}_gb_s"], 2), "GB/s",
                          config={**config, "source": src, "gib": round(u["gib"], 2)}))
    return out


def _replicas(raw: dict) -> list[dict]:
    """Output tok/s of 2 replicas against 1; on the shared-prefix trace, each prefix-aware
    router's hit rate and mean TTFT against round robin; each router's cost per request."""
    out = []
    tput = raw.get("throughput", {})
    one = next((r for k, r in tput.items() if k.startswith("1 x")), None)
    for k, r in tput.items():
        if one is not None and not k.startswith("1 x"):
            out.append(figure(f"output throughput, {k} replicas", round(r["output_tok_s"], 1), "tok/s",
                              peer="1 replica", peer_value=round(one["output_tok_s"], 1), config={"run": k}))
    shared = raw.get("shared_prefix", {})
    rr = shared.get("round_robin")
    for router, r in shared.items():
        if rr is None or router == "round_robin":
            continue
        out.append(figure(f"prefix-cache hit rate, 2 replicas, {router}", round(100 * r["hit_rate"], 1), "%",
                          peer="round robin", peer_value=round(100 * rr["hit_rate"], 1), config={"router": router}))
        out.append(figure(f"mean TTFT on a shared-prefix trace, 2 replicas, {router}", round(r["ttft_mean_ms"], 1),
                          "ms", peer="round robin", peer_value=round(rr["ttft_mean_ms"], 1), config={"router": router}))
    for n, costs in raw.get("router_cost_us", {}).items():
        for router, us in costs.items():
            out.append(figure(f"router cost per request, {router}, {n} replicas", round(us, 2), "us",
                              config={"router": router, "replicas": int(n)}))
    return out


def _quant_divergence(raw: dict) -> list[dict]:
    """Per scheme, against the float32 model over its greedy continuations (teacher-forced):
    mean next-token KL, top-1 agreement and the greedy share before the first difference."""
    out = []
    config = {"model": raw.get("model"), "prompts": raw.get("prompts"), "gen_tokens": raw.get("gen_tokens")}
    for label, r in raw.get("schemes", {}).items():
        c = r["continuation"]
        out.append(figure(f"next-token KL against float32, {label}", float(f"{c['kl_mean']:.3g}"), "nats",
                          config={**config, "kl_p99": round(c["kl_p99"], 3), "tv_mean": round(c["tv_mean"], 4)}))
        out.append(figure(f"top-1 agreement with float32, {label}", round(100 * c["top1_agreement"], 1), "%",
                          config=config))
        out.append(figure(f"greedy tokens before the first difference from float32, {label}",
                          round(100 * r["greedy_prefix_agreement"], 1), "%", config=config))
    return out


def _replicas_sim(raw: dict) -> list[dict]:
    """Simulated: per trace with shared prefixes and replica count, each router's prefix-cache
    hit rate and mean TTFT against round robin's."""
    out = []
    rows = raw.get("rows", [])
    rr = {(r["trace"], r["replicas"]): r for r in rows if r["router"] == "round_robin"}
    for r in rows:
        base = rr.get((r["trace"], r["replicas"]))
        if base is None or r is base or r["trace"] == "sharegpt":     # no shared prefix: no hits
            continue
        config = {"trace": r["trace"], "replicas": r["replicas"], "router": r["router"],
                  "cost_model": raw.get("cost"), "num_blocks": raw.get("num_blocks")}
        where = f"{r['trace']} trace, {r['replicas']} simulated replicas, {r['router']}"
        out.append(figure(f"prefix-cache hit rate, {where}", round(100 * r["prefix_hit_rate"], 1), "%",
                          peer="round robin", peer_value=round(100 * base["prefix_hit_rate"], 1), config=config))
        out.append(figure(f"mean TTFT, {where}", round(1000 * r["ttft"]["mean"], 1), "ms (simulated)",
                          peer="round robin", peer_value=round(1000 * base["ttft"]["mean"], 1), config=config))
    return out


def _kv_transfer(raw: dict) -> list[dict]:
    """Per document length: TTFT of the first ask after a restart with the disk tier against
    recomputing the document; the connector's copies in GB/s against a plain pinned copy."""
    out = []
    for doc, modes in raw.get("ttft", {}).items():
        if "disk" in modes and "recompute" in modes:
            out.append(figure(f"TTFT of the first ask after a restart, {doc}-token document, disk tier",
                              round(modes["disk"]["first_after_restart_mean_ms"], 1), "ms", peer="recompute",
                              peer_value=round(modes["recompute"]["first_after_restart_mean_ms"], 1),
                              config={"doc_tokens": int(doc)}))
    bw = raw.get("bandwidth")
    if bw:
        for part in ("device_to_host", "host_to_file", "file_to_host", "host_to_device"):
            out.append(figure(f"KV transfer {part.replace('_', ' ')}, {bw['blocks']} blocks",
                              round(bw[f"{part}_gbps"], 3), "GB/s", peer="pinned device -> host copy",
                              peer_value=round(bw["pinned_copy_ceiling_gbps"], 3),
                              config={"blocks": bw["blocks"], "block_bytes": bw["block_bytes"]}))
    return out


EXTRACTORS: dict[str, Callable[[Any], list[dict]]] = {
    "throughput": _throughput, "cpu": _cpu, "serving": _serving, "attention": _attention, "moe": _moe,
    "embed": _embed, "lora": _lora, "quant_gemm": _quant_gemm, "quant_fusion": _quant_fusion,
    "quant_decode": _quant_decode, "sleep_mode": _sleep_mode, "cold_start": _cold_start, "replicas": _replicas, "replicas_sim": _replicas_sim, "quant_divergence": _quant_divergence,
    "kv_transfer": _kv_transfer}


def extract(name: str, raw: Any) -> list[dict]:
    fn = EXTRACTORS.get(name)
    return fn(raw) if fn is not None and raw is not None else []
