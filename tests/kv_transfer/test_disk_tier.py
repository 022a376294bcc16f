"""The disk tier in the engine (tiny model, CPU): a restart finds its blocks and prefills
fewer tokens with the same greedy output; a temporary tier deletes its files; preemption,
abort and size-bound storms leak nothing on the device, the host tier or the disk; a load
that fails midway leaves its request recomputed, not lost."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import torch

from toolkit import LLM, SamplingParams
from toolkit.kv_transfer.scheduler import ConnectorScheduler
from toolkit.types import RequestStatus

BS = 4

BLOCK_BYTES = 2 * 2 * BS * 2 * 16 * 4
DOC = [(11 * j) % 480 + 20 for j in range(36)]          # a shared document of 9 blocks


def _prompts() -> list[list[int]]:
    return [DOC + [5 + k, 6 + 2 * k, 7 + k] for k in range(3)]


def _params(n: int = 6) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _count_tokens(llm: LLM) -> dict:
    """Wrap the runner: count the tokens every step computes."""
    runner, seen = llm.engine.runner, {"tokens": 0}
    real = runner.execute_model

    def execute_model(out, prev=None):
        seen["tokens"] += out.total_num_scheduled_tokens
        return real(out, prev)

    runner.execute_model = execute_model
    return seen


class _InlineIO:
    """An executor that runs each job at submit: the storm's schedule is the same every run."""

    def submit(self, fn, *args):
        from concurrent.futures import Future

        f = Future()
        try:
            f.set_result(fn(*args))
        except Exception as e:
            f.set_exception(e)
        return f

    def shutdown(self, wait=True):
        pass


def _no_leaks(llm: LLM) -> None:
    s = llm.engine.scheduler
    assert s.allocator.num_free_blocks() == s.allocator.num_blocks
    if isinstance(s, ConnectorScheduler):
        assert not s.remote and s.num_held_blocks() == 0 and not s.requests
        c = s.connector
        assert c.num_in_flight() == 0 and not c._saving and not c._chains
        store = c.store
        files = store.files()
        assert len(files) == store.num_blocks <= store.capacity_blocks
        assert not list(Path(store.root).glob(".tmp-*"))
    host = s.kv.host
    if host is not None:
        assert host.num_owned() == 0
        host.check()


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=256) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(_prompts(), _params(), use_tqdm=False)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_restart_finds_its_disk_cache(tiny_llama_dir, tmp_path, reference, async_scheduling):
    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64, kv_cache_dir=str(tmp_path),
              async_scheduling=async_scheduling)
    runs = []
    for _ in range(2):
        with LLM(tiny_llama_dir, **kw) as llm:
            seen = _count_tokens(llm)
            got = [o.outputs[0].token_ids for o in llm.generate(_prompts(), _params(), use_tqdm=False)]
            runs.append((got, seen["tokens"], llm.engine.scheduler.connector.num_loaded_blocks))
            _no_leaks(llm)
    (got1, tok1, loaded1), (got2, tok2, loaded2) = runs
    assert got1 == got2 == reference
    assert loaded1 == 0 and loaded2 >= len(DOC) // BS
    assert tok2 <= tok1 - len(DOC) + BS, (tok1, tok2)   # the document came from disk


def test_other_model_or_layout_never_reads_the_blocks(tiny_llama_dir, tmp_path, reference):
    """The directory is keyed by the model and the KV layout: another block size starts cold."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=64,
             kv_cache_dir=str(tmp_path)) as llm:
        llm.generate(_prompts(), _params(), use_tqdm=False)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=8, num_blocks=32,
             kv_cache_dir=str(tmp_path)) as llm:
        llm.generate(_prompts(), _params(), use_tqdm=False)
        assert llm.engine.scheduler.connector.num_hit_blocks == 0
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_temporary_tier_serves_evicted_prefixes_and_deletes_its_files(tiny_llama_dir, reference):
    """A 16-block device cache cannot keep the document between rounds: it comes from disk."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=16,
             max_num_seqs=1, kv_connector="disk") as llm:
        got = []
        for k, p in enumerate(_prompts()):
            got.append(llm.generate([p], _params(), use_tqdm=False)[0].outputs[0].token_ids)
            filler = [(13 * j + k) % 400 + 60 for j in range(44)]      # evicts the document
            llm.generate([filler], _params(1), use_tqdm=False)
        c = llm.engine.scheduler.connector
        root = Path(c.store.root)
        assert c.num_loaded_blocks > 0 and root.exists()
        _no_leaks(llm)
    assert got == reference
    assert not root.exists()


def test_preemption_and_abort_storm_leaks_nothing(tiny_llama_dir, tmp_path):
    """Shared prefixes, a 16-block device cache (preemptions), a 4-slot host tier, a disk tier
    bounded to 30 blocks (evictions), and random aborts of running, waiting and loading
    requests; a filler between the rounds pushes the prefixes out of device and host. The
    requests that finish match an ample engine's greedy outputs."""
    rng = random.Random(0)
    prompts = [DOC[: 12 + 4 * (k % 3)] + [30 + k, 31 + k] for k in range(10)]
    params = _params(10)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=256) as llm:
        ample = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=16,
             max_num_batched_tokens=16, host_cache_blocks=4, kv_cache_dir=str(tmp_path),
             kv_cache_dir_gb=30 * BLOCK_BYTES / 2**30) as llm:
        e, s = llm.engine, llm.engine.scheduler
        s.connector._io = _InlineIO()
        done, aborted = {}, set()
        for rnd in range(2):
            filler = [(13 * j + rnd) % 400 + 60 for j in range(40)]
            llm.generate([filler], _params(1), use_tqdm=False)
            live = [e.add_request(p, params, request_id=f"{rnd}-{i}", output_kind="final")
                    for i, p in enumerate(prompts)]
            steps = 0
            while e.has_unfinished():
                for o in e.step():
                    if o.finished and o.request_id not in aborted:
                        done[o.request_id] = o.outputs[0].token_ids
                steps += 1
                if steps % 3 == 0 and rng.random() < 0.6:
                    cands = [r for r in live if r not in done and r not in aborted]
                    if cands:
                        rid = rng.choice(cands)
                        e.abort(rid)
                        aborted.add(rid)
        assert e.num_preemptions > 0 and s.connector.num_loaded_blocks > 0
        assert s.connector.store.num_evicted > 0
        _no_leaks(llm)
    assert len(done) >= 10 and aborted
    for rid, toks in done.items():
        assert toks == ample[int(rid.split("-")[1])], rid


@pytest.mark.parametrize("load_async", [True, False], ids=["async", "sync"])
def test_a_failed_load_is_recomputed_not_lost(tiny_llama_dir, tmp_path, reference, load_async):
    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64, kv_cache_dir=str(tmp_path))
    with LLM(tiny_llama_dir, **kw) as llm:
        llm.generate(_prompts(), _params(), use_tqdm=False)
        ns = Path(llm.engine.scheduler.connector.store.root)
    if not load_async:                     # the same files, loaded before the step's forward
        from toolkit.kv_transfer.disk_store import DiskKVStore
        from toolkit.kv_transfer.store_connector import StoreConnector

        store = DiskKVStore(ns, (2, 2, BS, 2, 16), torch.float32, 2**20)
        kw = dict(kw, kv_cache_dir=None, kv_connector=StoreConnector(store, BS, load_async=False))
    with LLM(tiny_llama_dir, **kw) as llm:
        s = llm.engine.scheduler
        store, calls = s.connector.store, {"n": 0}
        real = store.get_into             # the connector's read

        def get(key, out):                # the third block read fails: the load is half done
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError("injected: disk read failed")
            return real(key, out)

        store.get_into = get
        got = [o.outputs[0].token_ids for o in llm.generate(_prompts(), _params(), use_tqdm=False)]
        assert s.num_failed_loads == 1 and s.connector.num_failed_blocks > 0
        _no_leaks(llm)
    assert got == reference


def test_config_is_validated(tiny_llama_dir):
    with pytest.raises(ValueError, match="kv_connector"):
        LLM(tiny_llama_dir, device="cpu", kv_connector="lmcache")
    with pytest.raises(ValueError, match="kv_role"):
        LLM(tiny_llama_dir, device="cpu", kv_connector="pd")
    with pytest.raises(ValueError, match="kv_cache_dir_gb"):
        LLM(tiny_llama_dir, device="cpu", kv_cache_dir="/tmp/x", kv_cache_dir_gb=0)
    with pytest.raises(ValueError, match="supports it"):
        LLM(tiny_llama_dir, device="cpu", num_blocks=32, kv_connector="disk", scheduler="static")


def test_a_loading_request_waits_while_the_others_run_and_can_be_aborted(tiny_llama_dir, tmp_path, reference):
    """Reads held back by an event: the request waits as WAITING_FOR_REMOTE_KVS while
    another one decodes; aborted then, its blocks stay allocated until the read ends."""
    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64, kv_cache_dir=str(tmp_path))
    with LLM(tiny_llama_dir, **kw) as llm:
        llm.generate(_prompts()[:2], _params(), use_tqdm=False)
    with LLM(tiny_llama_dir, **kw) as llm:
        e, s = llm.engine, llm.engine.scheduler
        gate, real = threading.Event(), s.connector.store.get_into
        s.connector.store.get_into = lambda key, out: (gate.wait(10), real(key, out))[1]
        other = e.add_request([9, 8, 7, 6, 5], _params(8), request_id="other", output_kind="final")
        e.step()
        for rid in ("a", "b"):
            e.add_request(_prompts()[0 if rid == "a" else 1], _params(), request_id=rid, output_kind="final")
        e.step()
        assert set(s.remote) == {"a", "b"}
        assert all(s.requests[r].status is RequestStatus.WAITING_FOR_REMOTE_KVS for r in "ab")
        before = s.requests[other].num_computed_tokens
        e.step()
        assert s.requests[other].num_computed_tokens == before + 1      # the step went on without them
        e.abort("a")
        assert s.num_held_blocks() > 0 and "a" not in s.requests
        gate.set()
        done = {}
        while e.has_unfinished():
            done.update({o.request_id: o.outputs[0].token_ids for o in e.step() if o.finished})
        assert done["b"] == reference[1] and "a" not in done
        _no_leaks(llm)
