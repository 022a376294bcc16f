"""The figures of the round-1 benchmarks (lora, quant_gemm, quant_fusion, sleep_mode, replicas,
kv_transfer), extracted from raw output in the shape each one writes (the CPU runs of lora
--shape tiny, kv_transfer --quick and sleep_mode --shape tiny wrote these shapes; quant_gemm
and quant_fusion need a GPU, their rows follow the scripts' json.dump), and each record valid."""

from __future__ import annotations

import pytest

from benchmarks.figures import EXTRACTORS, extract
from benchmarks.record import make_record, validate

LORA = {"shape": "tiny", "num_requests": 40, "workload": "synthetic", "rank": 16, "rows": [
    {"adapters": None, "output_tok_per_s": 4000.0, "steady_decode_step_ms": 4.0},
    {"adapters": 0, "output_tok_per_s": 3000.0, "steady_decode_step_ms": 5.0},
    {"adapters": 8, "output_tok_per_s": 2000.0, "steady_decode_step_ms": None}]}
QUANT_GEMM = {"shape": "llama8b", "rows": [
    {"batch": 1, "proj": "qkv", "n_in": 4096, "n_out": 6144, "bf16": 30.0, "bf16 floor": 12.0,
     "fp8": 20.0, "fp8 floor": 6.0},
    {"batch": 1, "proj": "o", "n_in": 4096, "n_out": 4096, "bf16": 10.0, "bf16 floor": 8.0,
     "fp8": 6.0, "fp8 floor": 4.0},
    {"batch": 16, "proj": "qkv", "n_in": 4096, "n_out": 6144, "bf16": 31.0, "bf16 floor": 12.0,
     "fp8": 21.0, "fp8 floor": 6.0}]}
QUANT_FUSION = {"shape": "llama8b", "rows": [
    {"codes": "float8_e4m3fn", "batch": 64, "norm unfused": 9.0, "norm unfused floor": 4.0, "norm fused": 6.0,
     "norm fused floor": 3.0, "silu unfused": 20.0, "silu unfused floor": 9.0, "silu fused": 10.0,
     "silu fused floor": 7.0}]}
SLEEP = {"shape": "tiny", "build_s": 2.0, "generate_s": 0.1, "weights_gib": 0.01,
         "levels": {"1": {"sleep_s": 0.1, "wake_weights_s": 0.2, "wake_kv_s": 0.1},
                    "2": {"sleep_s": 0.05, "wake_weights_s": 0.05, "wake_kv_s": 0.1}},
         "update": {"gib": 0.01, "from_host_s": 0.1, "from_device_s": 0.05,
                    "from_host_gb_s": 1.5, "from_device_gb_s": 3.0}}
REPLICAS = {"router_cost_us": {"2": {"round_robin": 1.5, "cache_aware": 40.0}},
            "throughput": {"1 x -": {"output_tok_s": 1000.0}, "2 x round_robin": {"output_tok_s": 1700.0}},
            "shared_prefix": {"round_robin": {"hit_rate": 0.4, "ttft_mean_ms": 50.0},
                              "prefix_affinity": {"hit_rate": 0.8, "ttft_mean_ms": 25.0}}}
KV = {"ttft": {"8192": {"recompute": {"first_after_restart_mean_ms": 400.0},
                        "disk": {"first_after_restart_mean_ms": 100.0}}},
      "bandwidth": {"blocks": 512, "block_bytes": 131072, "device_to_host_gbps": 20.0, "host_to_file_gbps": 3.0,
                    "file_to_host_gbps": 6.0, "host_to_device_gbps": 25.0, "pinned_copy_ceiling_gbps": 40.0}}


def _by_name(name: str, raw: dict) -> dict[str, dict]:
    figs = extract(name, raw)
    validate(make_record(name, f"python -m benchmarks {name}", figs))
    return {f["name"]: f for f in figs}


def test_every_new_benchmark_has_an_extractor():
    for name in ("lora", "quant_gemm", "quant_fusion", "quant_decode", "sleep_mode", "replicas", "replicas_sim",
                 "kv_transfer"):
        assert name in EXTRACTORS


def test_lora_figures_are_against_the_base_model():
    f = _by_name("lora", LORA)
    assert f["multi-LoRA output throughput, 8 adapters"]["ratio"] == 0.5
    assert f["multi-LoRA steady decode step, LoRA on, no adapter"]["ratio"] == 1.25
    assert "multi-LoRA steady decode step, 8 adapters" not in f           # no steady steps measured
    assert len(f) == 3


def test_quant_figures_sum_a_layer_and_compare_the_fused_pair():
    f = _by_name("quant_gemm", QUANT_GEMM)
    assert set(f) == {"fp8 GEMMs of a layer, llama8b, 1 tokens", "fp8 GEMMs of a layer, llama8b, 16 tokens"}
    one = f["fp8 GEMMs of a layer, llama8b, 1 tokens"]
    assert (one["value"], one["peer_value"], one["ratio"]) == (26.0, 40.0, 0.65)
    f = _by_name("quant_fusion", QUANT_FUSION)
    assert f["RMSNorm + float8_e4m3fn quant fused, llama8b, 64 tokens"]["ratio"] == pytest.approx(0.667)
    assert f["SiLU-and-mul + float8_e4m3fn quant fused, llama8b, 64 tokens"]["ratio"] == 0.5


def test_sleep_replicas_and_kv_transfer_figures():
    f = _by_name("sleep_mode", SLEEP)
    assert f["sleep + wake, level 1, tiny"]["value"] == 0.4 and f["sleep + wake, level 1, tiny"]["ratio"] == 0.2
    assert f["update_weights from device, tiny"]["value"] == 3.0
    f = _by_name("replicas", REPLICAS)
    assert f["output throughput, 2 x round_robin replicas"]["ratio"] == 1.7
    assert f["prefix-cache hit rate, 2 replicas, prefix_affinity"]["value"] == 80.0
    assert f["mean TTFT on a shared-prefix trace, 2 replicas, prefix_affinity"]["ratio"] == 0.5
    assert f["router cost per request, cache_aware, 2 replicas"]["value"] == 40.0
    f = _by_name("kv_transfer", KV)
    assert f["TTFT of the first ask after a restart, 8192-token document, disk tier"]["ratio"] == 0.25
    assert f["KV transfer host to device, 512 blocks"]["ratio"] == 0.625
    assert extract("replicas", {}) == [] and extract("kv_transfer", {"ttft": {}}) == []


def test_quant_decode_figures_are_against_bf16_at_the_same_batch(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "qd.json"            # the script's own CPU run writes the shape extracted
    subprocess.run([sys.executable, "-m", "benchmarks.quant_decode", "--tiny", "--schemes", "bf16,ct_fp8_dynamic",
                    "--batches", "1,4", "--steps", "2", "--out", str(out)], check=True, capture_output=True)
    f = _by_name("quant_decode", json.loads(out.read_text()))
    assert set(f) == {f"decode step, ct_fp8_dynamic weights, tiny, batch {b}" for b in (1, 4)}
    assert all(x["peer"] == "bf16 weights" and x["value"] > 0 for x in f.values())


def test_replicas_sim_figures_are_against_round_robin_on_shared_prefix_traces():
    def row(trace, n, router, hit, ttft):
        return {"trace": trace, "replicas": n, "router": router, "prefix_hit_rate": hit, "ttft": {"mean": ttft}}
    raw = {"cost": "nvidia-h200/qwen3-0.6b", "num_blocks": 1024, "rows": [
        row("sharegpt", 2, "round_robin", 0.0, 0.01), row("sharegpt", 2, "cache_aware", 0.0, 0.012),
        row("shared-prefix", 2, "round_robin", 0.25, 0.4), row("shared-prefix", 2, "cache_aware", 0.75, 0.02),
        row("shared-prefix", 4, "cache_aware", 0.7, 0.03)]}           # no round robin at 4: no peer
    f = _by_name("replicas_sim", raw)
    assert set(f) == {"prefix-cache hit rate, shared-prefix trace, 2 simulated replicas, cache_aware",
                      "mean TTFT, shared-prefix trace, 2 simulated replicas, cache_aware"}
    assert f["prefix-cache hit rate, shared-prefix trace, 2 simulated replicas, cache_aware"]["ratio"] == 3.0
    assert f["mean TTFT, shared-prefix trace, 2 simulated replicas, cache_aware"]["ratio"] == 0.05


def test_quant_divergence_figures_per_scheme():
    cont = {"kl_mean": 0.0872, "kl_p99": 0.74, "tv_mean": 0.108, "top1_agreement": 0.852}
    raw = {"model": "SmolLM2-135M-Instruct (embedded), float32", "prompts": 4, "gen_tokens": 32,
           "schemes": {"fp8 W8A8": {"continuation": cont, "greedy_prefix_agreement": 0.32}}}
    f = _by_name("quant_divergence", raw)
    assert f["next-token KL against float32, fp8 W8A8"]["value"] == 0.0872
    assert f["top-1 agreement with float32, fp8 W8A8"]["value"] == 85.2
    assert f["greedy tokens before the first difference from float32, fp8 W8A8"]["value"] == 32.0
