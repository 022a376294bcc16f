"""The disk tier under tensor parallelism (2 gloo processes on the CPU, the tiny model): each
rank saves and loads its slice of the KV heads in its own directory; a restart gives TP=1's
greedy tokens with the blocks loaded on every rank; the scheduler decides once how many
blocks are loadable (a block one rank lost cuts every rank's run there); nothing is left
on the device, the host or the disk, and a temporary tier deletes every rank's directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolkit import LLM, EngineConfig, SamplingParams
from toolkit.blocks.hashing import hash_blocks
from toolkit.kv_transfer.build import StoreSpec
from toolkit.kv_transfer.keys import block_key
from toolkit.kv_transfer.kv_store import MemoryKVStore
from toolkit.kv_transfer.proxy import disaggregated_generate
from toolkit.kv_transfer.store_connector import StoreConnector, StoreConnectorMetadata, Transfer
from toolkit.kv_transfer.tp import TPConnector, TPMetadata, open_rank, store_state
from toolkit.kv_transfer.worker import connector_step
from toolkit.types import SchedulerOutput

BS = 4
DOC = [(11 * j) % 480 + 20 for j in range(36)]          # a shared document of 9 blocks
PROMPTS = [DOC + [5 + k, 6 + 2 * k, 7 + k] for k in range(3)] + [[(3 * j) % 200 + 90 for j in range(13)]]
KW = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64)


def _params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _generate(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, _params(), use_tqdm=False)]


def _no_leaks(llm: LLM, *, shared: bool = False) -> list[dict]:
    """shared: a handoff directory another engine removes files from (its index is stale)."""
    s = llm.engine.scheduler
    assert s.allocator.num_free_blocks() == s.allocator.num_blocks
    assert not s.remote and s.num_held_blocks() == 0 and not s.requests
    c = s.connector
    assert isinstance(c, TPConnector)
    assert c.num_in_flight() == 0 and not c.inner._saving and not c.inner._chains
    states = llm.engine.runner.executor.call(store_state)
    for st in states:
        assert st["partial"] == 0 and (shared or st["files"] == st["stored"] <= st["capacity"])
        assert st["in_flight"] == 0 and st["saving"] == 0
    return states


@pytest.fixture(scope="module")
def tp1(tiny_llama_dir):
    with LLM(tiny_llama_dir, **KW) as llm:
        return _generate(llm)


def test_tp2_disk_tier_restart_equals_tp1(tiny_llama_dir, tmp_path, tp1):
    with LLM(tiny_llama_dir, tensor_parallel_size=2, kv_cache_dir=str(tmp_path), **KW) as llm:
        assert _generate(llm) == tp1
        c = llm.engine.scheduler.connector
        assert c.num_loaded_blocks == 0 and c.num_saved_blocks >= len(DOC) // BS
        states = _no_leaks(llm)
    roots = [Path(st["root"]) for st in states]
    assert [r.name.split("-", 1)[1] for r in roots] == ["tp2-rank0", "tp2-rank1"]
    assert all(r.parent == tmp_path and r.is_dir() for r in roots)
    assert all(len(list(r.glob("*.kv"))) == states[0]["stored"] for r in roots)   # kept for the restart
    # rank 1 loses the document's 6th block: no rank may load past the 5th
    cut = 5
    lost = roots[1] / (block_key(hash_blocks(DOC, BS, 0)[cut]) + ".kv")
    lost.unlink()
    with LLM(tiny_llama_dir, tensor_parallel_size=2, kv_cache_dir=str(tmp_path), **KW) as llm:
        assert _generate(llm) == tp1
        c = llm.engine.scheduler.connector
        loaded = [rc["loaded"] for rc in c.rank_counters]
        assert loaded[0] == loaded[1] == c.num_hit_blocks > 0, (loaded, c.num_hit_blocks)
        # the document's prompts load at most `cut` blocks each (9 had rank 1 not lost one), the
        # 4th prompt its 3 full blocks
        assert c.num_hit_blocks <= cut * 3 + 3 and c.num_failed_blocks == 0
        assert c.num_saved_blocks == 1                   # the lost block, saved again on both ranks
        _no_leaks(llm)
    assert lost.exists()                                 # computed again and saved by both ranks


def test_tp2_temporary_tier_loads_and_deletes_every_rank_dir(tiny_llama_dir, tp1):
    """A 16-block device cache cannot keep the document between requests: it comes from disk."""
    opts = dict(KW, num_blocks=16, max_num_seqs=1)
    with LLM(tiny_llama_dir, tensor_parallel_size=2, kv_connector="disk", **opts) as llm:
        got = []
        for k, p in enumerate(PROMPTS[:3]):
            got.append(llm.generate([p], _params(), use_tqdm=False)[0].outputs[0].token_ids)
            filler = [(13 * j + k) % 400 + 60 for j in range(44)]      # evicts the document
            llm.generate([filler], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        c, e = llm.engine.scheduler.connector, llm.engine
        assert c.num_loaded_blocks > 0
        e.add_request(PROMPTS[0], _params(), request_id="gone", output_kind="final")   # loads from disk
        e.step()
        assert "gone" in e.scheduler.remote             # still loading when it is aborted
        e.abort("gone")                                 # while loading: its blocks wait for every rank
        while e.has_unfinished():
            e.step()
        roots = [Path(st["root"]) for st in _no_leaks(llm)]
        assert all(r.exists() for r in roots)
    assert got == tp1[:3]
    assert not any(r.exists() for r in roots)


def test_tp2_pd_handoff_equals_tp1(tiny_llama_dir, tmp_path, tp1):
    """A TP=2 producer hands every rank's slice to the same rank of a TP=2 consumer through
    one handoff directory (kv_connector='pd', the servers' form)."""
    conn = [dict(kv_connector="pd", kv_role=r, kv_cache_dir=str(tmp_path)) for r in ("kv_producer", "kv_consumer")]
    with LLM(tiny_llama_dir, tensor_parallel_size=2, **conn[0], **KW) as prod, \
            LLM(tiny_llama_dir, tensor_parallel_size=2, **conn[1], **KW) as cons:
        got = disaggregated_generate(prod.engine, cons.engine, PROMPTS, _params())
        pc, cc = prod.engine.scheduler.connector, cons.engine.scheduler.connector
        assert pc.inner.num_handoffs == len(PROMPTS) and pc.num_saved_blocks > 0
        assert cc.num_loaded_blocks > 0 and cc.num_failed_blocks == 0
        _no_leaks(prod, shared=True)
        assert all(st["files"] == 0 for st in _no_leaks(cons, shared=True))     # every handoff consumed
    assert got == tp1


class _ScriptedRanks:
    """An executor whose ranks answer each step with scripted replies (no processes)."""
    size = 2

    def __init__(self, root: Path) -> None:
        self.root, self.replies, self.calls = root, [], 0

    def call(self, fn, *args):
        if fn is open_rank:
            return [(str(self.root / f"r{r}"), 64) for r in range(self.size)]
        self.calls += 1
        return self.replies.pop(0)


def _step(c: TPConnector, meta=None) -> tuple[set, set, set]:
    out = SchedulerOutput(kv_connector_metadata=meta)
    kvo = connector_step(c, out, 2)
    return kvo.finished_sending, kvo.finished_recving, kvo.invalid_block_ids


def test_a_transfer_is_finished_when_every_rank_finished_it(tmp_path):
    """Rank 0 reports load "a" a step before rank 1, which failed one of its blocks: "a" is
    reported once, with that block; a save ends (its keys forgotten) when both ranks wrote it;
    with nothing planned or pending no round trip is made."""
    ex = _ScriptedRanks(tmp_path)
    c = TPConnector(StoreSpec("disk", str(tmp_path), "m", 2**20, BS), ex)
    c.open(None)
    c.inner._saving.add("k9")
    loads = [Transfer("a", [("k1", 3), ("k2", 4)]), Transfer("b", [("k3", 7)])]
    meta = TPMetadata(StoreConnectorMetadata(loads, [Transfer("c", [("k9", 1)])]), ["k0"], [])
    n = dict(loaded=0, saved=0, failed=0, in_flight=1)
    ex.replies = [[(set(), {"a"}, set(), n), (set(), set(), {4}, dict(n, failed=1))]]
    assert _step(c, meta) == (set(), set(), set())
    assert c.num_in_flight() > 0
    done = dict(n, in_flight=0)
    ex.replies = [[({"c"}, {"b"}, set(), done), ({"c"}, {"a", "b"}, set(), dict(done, failed=1))]]
    assert _step(c) == ({"c"}, {"a", "b"}, {4})
    assert not c.inner._saving and c.num_in_flight() == 0 and c.num_failed_blocks == 1
    assert _step(c) == (set(), set(), set()) and ex.calls == 2
    c.inner.store.touch(["k5"])                          # a touch alone goes to the ranks
    ex.replies = [[(set(), set(), set(), done)] * 2]
    assert _step(c, c.build_connector_meta(None)) == (set(), set(), set()) and ex.calls == 3


def test_a_dead_rank_at_close_still_leaves_no_temporary_directory(tmp_path):
    """The last saves fail on a dead rank and so does the close: the temporary tier's
    directories (every rank's) are deleted all the same, and close returns."""
    class Dead(_ScriptedRanks):
        def call(self, fn, *args):
            if fn is open_rank:
                return super().call(fn, *args)
            raise RuntimeError("rank 1 is gone")

    ex = Dead(tmp_path)
    c = TPConnector(StoreSpec("disk", None, "m", 2**20, BS), ex)
    c.open(None)
    roots = c.inner.store.roots
    for r in roots:
        r.mkdir()
        (r / "k1.kv").write_bytes(bytes(64))
    c.inner.store.touch(["k1"])                          # work for a last step: it fails first
    c.close()
    assert not any(r.exists() for r in roots)


def test_a_disk_tier_too_small_for_one_block_per_rank_is_refused_per_rank(tiny_llama_dir):
    block = 2 * 2 * BS * 1 * 16 * 4                     # a rank's slice: 1 of 2 KV heads, fp32
    with pytest.raises(ValueError, match="split over 2 tensor-parallel ranks .* give at least"):
        LLM(tiny_llama_dir, tensor_parallel_size=2, kv_connector="disk", kv_cache_dir_gb=1.5 * block / 2**30, **KW)


def test_a_connector_instance_is_refused_with_tp():
    with pytest.raises(ValueError, match="instance cannot serve tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=2,
                     kv_connector=StoreConnector(MemoryKVStore((2, 2, BS, 1, 16), torch.float32, 4), BS))


@pytest.mark.gpu
def test_tp2_nccl_disk_tier_restart_equals_tp1(tiny_llama_dir, tmp_path):
    """On 2 GPUs: each rank gathers its slice through pinned memory and an event, loads
    through pinned staging; a restart gives TP=1's greedy tokens (CUDA graphs on)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    opts = dict(dtype="float32", block_size=16, num_blocks=256)
    prompts = [DOC * 4 + [5 + k, 6 + k] for k in range(3)]
    with LLM(tiny_llama_dir, **opts) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, _params(), use_tqdm=False)]
    for run in range(2):
        with LLM(tiny_llama_dir, tensor_parallel_size=2, kv_cache_dir=str(tmp_path), **opts) as llm:
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, _params(), use_tqdm=False)] == want
            c = llm.engine.scheduler.connector
            assert (c.num_loaded_blocks > 0) == (run == 1)
            _no_leaks(llm)
