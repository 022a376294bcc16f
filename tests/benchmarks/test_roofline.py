"""benchmarks/roofline.py: kernel names to kinds, a decode step's bytes and FLOPs, the table."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from benchmarks import roofline

G = SimpleNamespace(hidden=8, num_heads=4, num_kv_heads=2, head_dim=2, intermediate=12,
                    num_layers=3, vocab_size=50)


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_splitK_TNT", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("_paged_attention_kernel", "attention"), ("_merge_attention_states_kernel", "attention"),
    ("_merge_kernel", "other"),                       # the sampler's logprob merge, not attention's
    ("_rms_norm_kernel", "norm"), ("_rotary_kernel", "rotary"), ("_write_kv_kernel", "kv_write"),
    ("_silu_and_mul_kernel", "activation"), ("Memcpy HtoD (Pinned -> Device)", "other"),
])
def test_kernel_kinds(name, kind):
    assert roofline.kind_of(name) == kind


def test_decode_step_work_counts_weights_kv_and_flops():
    lens = [3, 5]
    w = roofline.decode_step_work(G, lens)
    q, kv = 4 * 2, 2 * 2
    weights = G.num_layers * (8 * (q + 2 * kv) + q * 8 + 8 * 24 + 12 * 8) + 8 * 50    # + LM head
    acts = G.num_layers * 2 * ((8 + q + 2 * kv) + (q + 8) + (8 + 24) + (12 + 8)) + 2 * (8 + 50)
    assert sum(b for b, _ in w["gemm"]) == 2 * (weights + acts)
    assert sum(f for _, f in w["gemm"]) == 2 * 2 * weights            # 2 FLOPs a weight a token
    assert sum(b for b, _ in w["attention"]) == G.num_layers * (8 * kv * 2 * 2 + 2 * q * 2 * 2)
    assert len(w["gemm"]) == 4 * G.num_layers + 1 and len(w["norm"]) == 2 * G.num_layers + 1


def test_floor_is_the_larger_of_bandwidth_and_compute_per_op():
    ops = [(100.0, 0.0), (10.0, 1000.0)]
    assert math.isclose(roofline.floor_ms(ops, copy_bw=10.0, matmul_flops=100.0), 1e3 * (10.0 + 10.0))


def test_table_sums_kinds_and_names_the_ratio():
    kernels = {"nvjet_a": [2.0, 3.0], "_rms_norm_kernel": [7.0, 0.5], "mystery": [1.0, 0.25]}
    work = {"gemm": [(1.5e9, 0.0)], "norm": [(0.05e9, 0.0)]}
    rows = {r["kind"]: r for r in roofline.roofline_table(kernels, work, copy_bw=1e12, matmul_flops=1e15)}
    assert rows["gemm"]["measured_ms"] == 3.0 and math.isclose(rows["gemm"]["ratio"], 2.0)
    assert rows["other"]["measured_ms"] == 0.25 and rows["other"]["ratio"] == float("inf")
    assert math.isclose(rows["total"]["measured_ms"], 3.75) and math.isclose(rows["total"]["floor_ms"], 1.55)
    assert rows["total"]["launches"] == 10
    assert "total" in roofline.format_table(list(rows.values()))
