"""A closed engine with a KV connector frees its memory, and an engine that only waits for a
load does not spin (tiny model, CPU).

- close(): the KV cache and the weights are unreferenced once the LLM is closed, even while
  the caller still holds the LLM and the connector instance it passed (a benchmark that
  builds engine after engine in one process: each next KV cache is sized from the free
  device memory), and without a collector pass of the caller's own;
- a request parked for an asynchronous disk load (WAITING_FOR_REMOTE_KVS): the empty steps
  meanwhile block on the load (worker.IDLE_WAIT_S at most each), they do not return at once."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch

from toolkit import LLM, SamplingParams
from toolkit.kv_transfer.disk_store import DiskKVStore
from toolkit.kv_transfer.store_connector import StoreConnector
from toolkit.kv_transfer.worker import IDLE_WAIT_S

BS = 4
BLOCK_SHAPE = (2, 2, BS, 2, 16)                         # the tiny model's [layers, 2, bs, H, D]
DOC = [(11 * j) % 480 + 20 for j in range(36)]          # 9 blocks


def _kw(**extra):
    return dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64, **extra)


def _params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


@pytest.mark.parametrize("how", ["instance", "kv_cache_dir"])
def test_close_frees_the_kv_cache_and_the_weights(tiny_llama_dir, tmp_path, how):
    if how == "instance":                # the caller keeps the connector (and the closed LLM)
        store = DiskKVStore(tmp_path / "b", BLOCK_SHAPE, torch.float32, 2**22)
        extra = dict(kv_connector=StoreConnector(store, BS))
    else:
        extra = dict(kv_cache_dir=str(tmp_path))
    llm = LLM(tiny_llama_dir, **_kw(**extra))
    llm.generate([DOC + [5, 6]], _params(), use_tqdm=False)
    runner = llm.engine.runner
    kv_cache = weakref.ref(runner.kv_cache)
    kv_layer = weakref.ref(runner.kv_cache.layers[0])
    weight = weakref.ref(next(runner.model.parameters()))
    connector = llm.engine.scheduler.connector
    del runner
    was = gc.isenabled()
    gc.disable()                         # close() alone must free them, not a later collector pass
    try:
        llm.close()
        assert kv_layer() is None, "the KV cache outlives close()"
        assert weight() is None, "the weights outlive close()"
        assert connector.kv_layers == []
    finally:
        if was:
            gc.enable()
    del llm, connector
    gc.collect()
    assert kv_cache() is None


def test_waiting_for_a_load_blocks_instead_of_spinning(tiny_llama_dir, tmp_path):
    kw = _kw(kv_cache_dir=str(tmp_path))
    with LLM(tiny_llama_dir, **kw) as llm:          # the document's blocks on disk
        llm.generate([DOC + [5, 6]], _params(), use_tqdm=False)
    delay = 0.05                                    # per block read: a slow disk
    with LLM(tiny_llama_dir, **kw) as llm:
        e = llm.engine
        store = e.scheduler.connector.store
        real = store.get_into                       # the connector's read

        def slow_get(key, out):
            time.sleep(delay)
            return real(key, out)

        store.get_into = slow_get
        rid = e.add_request(DOC + [7, 8], _params(), output_kind="final")
        t0, steps, parked, out = time.perf_counter(), 0, 0, None
        while e.has_unfinished():
            for o in e.step():
                if o.request_id == rid and o.finished:
                    out = o
            steps += 1
            parked += rid in e.scheduler.remote
        took = time.perf_counter() - t0
        c = e.scheduler.connector
        assert c.num_loaded_blocks >= len(DOC) // BS - 1 and out is not None
        assert took >= delay * c.num_loaded_blocks
        # spinning: thousands of empty steps in this time; blocking: about took / IDLE_WAIT_S or fewer
        assert parked <= took / IDLE_WAIT_S + 10, (parked, steps, took)
