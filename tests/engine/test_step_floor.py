"""benchmarks/step_floor.py: a run's steps split into bands, each against its own floor."""

from __future__ import annotations

import pytest

from benchmarks import roofline, step_floor
from toolkit import LLM, SamplingParams

BW, MM = 4.0e12, 800e12


class G:
    hidden, num_heads, num_kv_heads, head_dim, intermediate, num_layers, vocab_size = 64, 4, 2, 16, 128, 2, 100


def test_band_of():
    assert step_floor.band_of(5, 3) == "admitting"
    assert [step_floor.band_of(n, 0) for n in (1, 16, 17, 64, 65, 256, 257, 1000)] == \
        ["decode 1-16"] * 2 + ["decode 17-64"] * 2 + ["decode 65-256"] * 2 + ["decode 257+"] * 2
    assert step_floor.band_of(3, 0, edges=(2,)) == "decode 3+"


def test_step_work_of_decode_rows_is_decode_step_work():
    assert roofline.step_work(G, [(8, 1), (12, 1)]) == roofline.decode_step_work(G, [9, 13])


def test_step_work_of_a_chunk_after_a_prefix():
    # a chunk of 3 after 5 cached tokens reads 8 tokens' KV and attends 6 + 7 + 8 pairs a head
    w = roofline.step_work(G, [(5, 3)], num_sampled=0)
    q, kv = G.num_heads * G.head_dim, G.num_kv_heads * G.head_dim
    assert w["attention"][0] == (8 * kv * 2 * 2 + 3 * q * 2 * 2, 4.0 * 21 * q)
    lm_head = w["gemm"][-1]
    assert lm_head[1] == 0.0                     # no row sampled: the LM head does no work
    assert len(w["gemm"]) == 4 * G.num_layers + 1


def test_profile_by_band_covers_every_step_once(tiny_llama_dir):
    seen = []

    def fake_profile(fn):                        # the CPU has no kernels: count the segments
        seen.append(1)
        fn()
        return {"kinds_ms": {"gemm": 1.0, "attention": 0.5}}

    outs = [3, 9, 20, 40]                        # the running count falls through the bands
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=128,
             max_num_seqs=2, max_num_batched_tokens=32) as llm:
        g = roofline.Geometry.of(llm.engine.runner.model.config)
        reqs = [([1 + i] * (5 + i), SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
                for i, n in enumerate(outs)]
        bands = step_floor.profile_by_band(llm.engine, reqs, g, BW, MM, edges=(1,), profile=fake_profile)
        assert not llm.engine.has_unfinished()
        steps = llm.engine.num_steps
    names = [b.name for b in bands]
    assert names[0] == "admitting" and set(names) <= {"admitting", "decode 1-1", "decode 2+"}
    assert "decode 1-1" in names                 # the longest request runs alone at the end
    assert sum(b.steps for b in bands) == steps
    # the tokens run are every prompt token and every output token but each request's first
    assert sum(b.tokens for b in bands) == sum(5 + i for i in range(4)) + sum(outs) - len(outs)
    assert sum(b.gpu_ms["gemm"] for b in bands) == pytest.approx(len(seen))
    for b in bands:
        assert b.floor_ms["gemm"] > 0 and b.floor_ms["attention"] > 0
    text = step_floor.table(bands)
    assert "**all**" in text and text.count("\n") == len(bands) + 2
