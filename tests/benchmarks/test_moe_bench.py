"""The MoE benchmark (`python -m benchmarks moe`): its torch grouped-GEMM peer against the
experts' twin, the decode step's roofline at the Qwen3-30B-A3B shape, and a CPU run at the toy
shape end to end through the entry point, which writes a valid record with every part's figures."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.moe import decode_floor_ms, grouped_mm_experts, layer_case
from benchmarks.record import validate
from toolkit.kernels import reference_moe
from toolkit.models.shapes import qwen3_30b_a3b


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
@pytest.mark.parametrize("t,e,k", [(1, 8, 2), (7, 6, 6), (12, 16, 1)])
def test_the_grouped_mm_peer_equals_the_twin(t, e, k):
    """Experts with no token included (1 token of 8 experts); dims of 16-byte strides."""
    case = layer_case(t, e, k, 32, 24, torch.float32, "cpu", seed=t)
    torch.testing.assert_close(grouped_mm_experts(*case), reference_moe.fused_experts(*case), rtol=1e-4, atol=1e-4)


def test_the_decode_roofline_reads_the_experts_a_batch_touches():
    c = qwen3_30b_a3b()
    f = {b: decode_floor_ms(c, b, 512, 2, 4.8e12, 990e12) for b in (1, 16, 256)}
    assert f[1]["touched"] == pytest.approx(8) and f[256]["touched"] == pytest.approx(128, rel=1e-3)
    assert f[1]["floor_ms"] < f[16]["floor_ms"] < f[256]["floor_ms"]
    # batch 1: the 8 selected experts' weights of 48 layers (1.8 GB) dominate the bytes
    experts = 8 * 3 * 2048 * 768 * 2 * 48 / 4.8e12 * 1e3
    assert experts < f[1]["floor_by_kind_ms"]["moe"] < 1.1 * experts


def test_the_toy_run_writes_a_valid_record(tmp_path, monkeypatch):
    from benchmarks.__main__ import run

    monkeypatch.setenv("OUT", str(tmp_path))
    rec = json.loads(run("moe", ["--toy"]).read_text())
    validate(rec)
    names = [f["name"] for f in rec["figures"]]
    assert any(n.startswith("MoE layer grouped_mm, tiny-moe") for n in names)
    assert sum(n.startswith("decode step, tiny-moe") for n in names) == 2
    assert any(n.startswith("output throughput, tiny-moe") for n in names)
    assert all(f["value"] > 0 and f["peer_value"] > 0 for f in rec["figures"])
    assert rec["raw"]["toy"] is True


@pytest.mark.gpu
def test_on_the_gpu_the_peers_equal_the_twin_and_replay_in_a_graph():
    """The Qwen3-30B-A3B layer in bf16 at 64 tokens: the fused kernel and the grouped-GEMM peer
    equal the twin, and both are timed replayed from a CUDA graph (no host sync in either)."""
    from benchmarks.moe import time_ms
    from toolkit.kernels.fused_moe import fused_experts

    case = layer_case(64, 128, 8, 2048, 768, torch.bfloat16, "cuda")
    want = reference_moe.fused_experts(*case).float()
    for fn in (fused_experts, grouped_mm_experts):
        torch.testing.assert_close(fn(*case).float(), want, rtol=2e-2, atol=2e-2)
        assert time_ms(lambda fn=fn: fn(*case), graph=True) > 0
