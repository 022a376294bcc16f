"""KV connectors over an fp8 KV cache (tiny model, CPU): blocks travel as their raw e4m3
bytes; a disk tier found after a restart and a prefill/decode handoff give the co-located
fp8 engine's greedy tokens; a block saved under one set of scales is never read by an
engine with other scales (the store's namespace has their digest, a shared store refuses
a second format). The loaded bytes are the ones the saving engine computed for the same
prompts in the same batch, so fp8 rounding cannot tell the two apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolkit import LLM, SamplingParams
from toolkit.kv_transfer.kv_store import MemoryKVStore
from toolkit.kv_transfer.pd import PDConnector
from toolkit.kv_transfer.proxy import disaggregated_generate

BS = 4
BLOCK_SHAPE = (2, 2, BS, 2, 16)     # the tiny model's KV block: [layers, 2, bs, kv heads, head_dim]

FP8 = torch.float8_e4m3fn
DOC = [(11 * j) % 480 + 20 for j in range(36)]          # a shared document of 9 blocks
KW = dict(dtype="float32", device="cpu", block_size=BS, kv_cache_dtype="fp8")


def _prompts() -> list[list[int]]:
    return [DOC + [5 + k, 6 + 2 * k, 7 + k] for k in range(3)] + [[(3 * j) % 200 + 90 for j in range(13)]]


def _params(n: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _no_leaks(llm: LLM) -> None:
    s = llm.engine.scheduler
    assert s.allocator.num_free_blocks() == s.allocator.num_blocks
    assert not s.remote and s.num_held_blocks() == 0 and s.connector.num_in_flight() == 0


@pytest.fixture(scope="module")
def colocated(tiny_llama_dir):
    with LLM(tiny_llama_dir, num_blocks=64, **KW) as llm:
        assert llm.engine.runner.kv_cache.is_fp8
        return [o.outputs[0].token_ids for o in llm.generate(_prompts(), _params(), use_tqdm=False)]


def test_disk_tier_restart_with_fp8(tiny_llama_dir, tmp_path, colocated):
    runs = []
    for _ in range(2):
        with LLM(tiny_llama_dir, num_blocks=64, kv_cache_dir=str(tmp_path), **KW) as llm:
            got = [o.outputs[0].token_ids for o in llm.generate(_prompts(), _params(), use_tqdm=False)]
            c = llm.engine.scheduler.connector
            runs.append((got, c.num_loaded_blocks, Path(c.store.root)))
            assert c.store.dtype == FP8 and c.store.block_bytes == 2 * 2 * BS * 2 * 16   # 1 byte a value
            _no_leaks(llm)
    (got1, loaded1, root1), (got2, loaded2, root2) = runs
    assert got1 == got2 == colocated
    assert loaded1 == 0 and loaded2 >= len(DOC) // BS and root1 == root2
    assert "float8_e4m3fn|scales:" in (root1 / "FORMAT").read_text()


def test_other_scales_never_read_the_blocks(tiny_llama_dir, tmp_path):
    """Calibrated scales, then given ones: another namespace (a cold start); a store instance
    shared with an engine of other scales is refused at build."""
    with LLM(tiny_llama_dir, num_blocks=64, kv_cache_dir=str(tmp_path), **KW) as llm:
        llm.generate(_prompts(), _params(2), use_tqdm=False)
    with LLM(tiny_llama_dir, num_blocks=64, kv_cache_dir=str(tmp_path), kv_scales=(0.01, 0.02), **KW) as llm:
        llm.generate(_prompts(), _params(2), use_tqdm=False)
        assert llm.engine.scheduler.connector.num_hit_blocks == 0
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    with pytest.raises(ValueError, match=r"holds blocks of .* torch\.float32; this engine's are .* torch\.float8_e4m3fn"):
        LLM(tiny_llama_dir, num_blocks=64, **KW,
            kv_connector=PDConnector(MemoryKVStore(BLOCK_SHAPE, torch.float32, 64), BS, "kv_producer"))
    store = MemoryKVStore(BLOCK_SHAPE, FP8, 64)
    with LLM(tiny_llama_dir, num_blocks=64, kv_connector=PDConnector(store, BS, "kv_producer"), **KW):
        with pytest.raises(ValueError, match="KV format"):
            LLM(tiny_llama_dir, num_blocks=64, kv_connector=PDConnector(store, BS, "kv_consumer"),
                kv_scales=(0.01, 0.02), **KW)


@pytest.mark.parametrize("where", ["dir", "memory"])
def test_pd_handoff_with_fp8(tiny_llama_dir, tmp_path, colocated, where):
    """A handoff directory (kv_connector='pd', the servers' form) or a shared in-memory store."""
    if where == "dir":
        conn = [dict(kv_connector="pd", kv_role=r, kv_cache_dir=str(tmp_path)) for r in ("kv_producer", "kv_consumer")]
    else:
        store = MemoryKVStore(BLOCK_SHAPE, FP8, 256)
        conn = [dict(kv_connector=PDConnector(store, BS, r)) for r in ("kv_producer", "kv_consumer")]
    with LLM(tiny_llama_dir, num_blocks=64, **conn[0], **KW) as prod, \
            LLM(tiny_llama_dir, num_blocks=64, **conn[1], **KW) as cons:
        got = disaggregated_generate(prod.engine, cons.engine, _prompts(), _params())
        pc, cc = prod.engine.scheduler.connector, cons.engine.scheduler.connector
        assert pc.num_handoffs == len(_prompts()) and cc.num_loaded_blocks > 0 and cc.num_failed_blocks == 0
        assert cc.store.num_blocks == 0                     # every handoff consumed
        _no_leaks(prod)
        _no_leaks(cons)
    assert got == colocated


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_conformance_with_fp8_blocks(tmp_path, kind):
    """The public check over float8 KV caches: a load returns the saved bytes bit for bit."""
    from toolkit.kv_transfer.disk_store import DiskKVStore
    from toolkit.kv_transfer.store_connector import StoreConnector
    from toolkit.testing import check_kv_connector

    block = (2, 2, 4, 2, 8)
    store = (MemoryKVStore(block, FP8, 64) if kind == "memory"
             else DiskKVStore(tmp_path / "ns", block, FP8, 64 * 2 * 2 * 4 * 2 * 8))
    c = StoreConnector(store, 4)
    try:
        check_kv_connector(c, num_layers=2, block_size=4, num_kv_heads=2, head_dim=8, dtype=FP8)
    finally:
        c.close()


@pytest.mark.gpu
def test_disk_tier_restart_with_fp8_on_cuda(tiny_llama_dir, tmp_path):
    """fp8 blocks through pinned memory (uint8 views) on the GPU; a restart gives the same tokens."""
    kw = dict(KW, device="cuda", block_size=16, num_blocks=128)
    prompts = [DOC * 4 + [5 + k, 6 + k] for k in range(3)]
    with LLM(tiny_llama_dir, **kw) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, _params(), use_tqdm=False)]
    for run in range(2):
        with LLM(tiny_llama_dir, kv_cache_dir=str(tmp_path), **kw) as llm:
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, _params(), use_tqdm=False)] == want
            assert (llm.engine.scheduler.connector.num_loaded_blocks > 0) == (run == 1)
            _no_leaks(llm)
