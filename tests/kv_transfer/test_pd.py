"""Prefill/decode disaggregation with two engines in one process (tiny model, CPU): the
producer prefills and samples the first token, the consumer loads the handed-off KV and
continues; the greedy outputs equal a co-located engine's, with prefix hits and
preemptions on the consumer, and nothing is left held on either engine or in the store."""

from __future__ import annotations

import pytest
import torch

from toolkit import LLM, SamplingParams
from toolkit.kv_transfer.kv_store import MemoryKVStore
from toolkit.kv_transfer.pd import PDConnector, handoff_request
from toolkit.kv_transfer.proxy import disaggregated_generate

BS = 4
BLOCK_SHAPE = (2, 2, BS, 2, 16)       # the tiny model's KV block: [layers, 2, bs, kv heads, head_dim]
PRE = [(17 * j) % 450 + 40 for j in range(22)]


def _prompts() -> list[list[int]]:
    """Two share a 22-token prefix (the consumer's prefix cache hits), two do not; lengths
    ragged (partial last blocks)."""
    return [PRE + [7, 8, 9], PRE + [10, 11], [(5 * j) % 300 + 30 for j in range(17)],
            [(3 * j) % 200 + 90 for j in range(13)], PRE + [12]]


def _no_leaks(llm: LLM) -> None:
    s = llm.engine.scheduler
    assert s.allocator.num_free_blocks() == s.allocator.num_blocks
    assert not s.remote and s.num_held_blocks() == 0 and s.connector.num_in_flight() == 0


@pytest.fixture(scope="module")
def colocated(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=256) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(_prompts(), params, use_tqdm=False)]


@pytest.mark.parametrize("load_async,consumer_blocks", [(True, 64), (True, 14), (False, 14)],
                         ids=["async", "async-preempt", "sync-preempt"])
def test_disaggregated_greedy_equals_colocated(tiny_llama_dir, colocated, load_async, consumer_blocks):
    store = MemoryKVStore(BLOCK_SHAPE, torch.float32, 256)
    kw = dict(dtype="float32", device="cpu", block_size=BS)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(tiny_llama_dir, num_blocks=64, kv_connector=PDConnector(store, BS, "kv_producer"), **kw) as prod, \
            LLM(tiny_llama_dir, num_blocks=consumer_blocks, max_num_batched_tokens=16,
                kv_connector=PDConnector(store, BS, "kv_consumer", load_async=load_async), **kw) as cons:
        ps = _prompts()           # two batches: the second's shared prefix is cached on the consumer
        got = (disaggregated_generate(prod.engine, cons.engine, ps[:2], params, prefix="one")
               + disaggregated_generate(prod.engine, cons.engine, ps[2:], params, prefix="two"))
        pc, cc = prod.engine.scheduler.connector, cons.engine.scheduler.connector
        assert pc.num_handoffs == len(_prompts())
        assert cc.num_loaded_blocks > 0
        # the shared prefix came from the consumer's own prefix cache for the later requests
        assert cc.num_hit_blocks < sum(-(-len(p) // BS) for p in _prompts())
        if consumer_blocks < 64:
            assert cons.engine.num_preemptions > 0
        # the producer computed every prompt; the consumer computed no prompt again except
        # after a preemption (recompute)
        _no_leaks(prod)
        _no_leaks(cons)
        assert store.num_blocks == 0          # every handoff was consumed
    assert got == colocated


def test_a_consumer_without_the_handoff_recomputes(tiny_llama_dir, colocated):
    """The same request on a consumer whose store never saw it: computed there in full."""
    store = MemoryKVStore(BLOCK_SHAPE, torch.float32, 16)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=64,
             kv_connector=PDConnector(store, BS, "kv_consumer")) as cons:
        first = colocated[0][0]
        ids, p2 = handoff_request(_prompts()[0], params, first)
        out = cons.generate([ids], p2, use_tqdm=False)[0].outputs[0].token_ids
        assert cons.engine.scheduler.connector.num_loaded_blocks == 0
    assert [first] + out == colocated[0]


def test_handoff_request_validates():
    with pytest.raises(ValueError, match="max_tokens"):
        handoff_request([1, 2], SamplingParams(max_tokens=1), 5)
    ids, p = handoff_request([1, 2], SamplingParams(max_tokens=4, min_tokens=2), 5)
    assert ids == [1, 2, 5] and p.max_tokens == 3 and p.min_tokens == 1
    with pytest.raises(ValueError, match="role"):
        PDConnector(MemoryKVStore(BLOCK_SHAPE, torch.float32, 4), BS, "kv_both")


def test_consumer_given_the_prompt_alone_recomputes_its_last_token(tiny_llama_dir, colocated):
    """vLLM's proxy: the consumer gets the original request (no first token); it loads all
    but the last prompt token and samples the first token itself: the same greedy tokens."""
    store = MemoryKVStore(BLOCK_SHAPE, torch.float32, 256)
    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(tiny_llama_dir, kv_connector=PDConnector(store, BS, "kv_producer"), **kw) as prod, \
            LLM(tiny_llama_dir, kv_connector=PDConnector(store, BS, "kv_consumer"), **kw) as cons:
        for i, p in enumerate(_prompts()):
            prod.engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=1), request_id=f"q{i}")
        while prod.engine.has_unfinished():
            prod.engine.step()
        for i, p in enumerate(_prompts()):
            cons.engine.add_request(p, params, request_id=f"q{i}", output_kind="final")
        got = {}
        while cons.engine.has_unfinished():
            got.update({o.request_id: o.outputs[0].token_ids for o in cons.engine.step() if o.finished})
        assert cons.engine.scheduler.connector.num_loaded_blocks > 0
        assert store.num_blocks == 0
        _no_leaks(cons)
    assert [got[f"q{i}"] for i in range(len(_prompts()))] == colocated


@pytest.mark.parametrize("written", [True, False], ids=["lands-late", "never"])
def test_a_consumer_asked_before_the_handoff_lands_waits_for_it(tiny_llama_dir, colocated, written):
    """The HTTP proxy asks the consumer as soon as the prefill answered, which can be before
    the producer's write lands: with handoff_wait_s the request is parked and its load waits
    for the keys (loaded, nothing recomputed); a handoff that never comes fails the load after
    the wait and the request is recomputed. Either way the greedy tokens are the co-located ones."""
    store = MemoryKVStore(BLOCK_SHAPE, torch.float32, 256)
    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = _prompts()[2:4]
    with LLM(tiny_llama_dir, kv_connector=PDConnector(store, BS, "kv_producer"), **kw) as prod, \
            LLM(tiny_llama_dir, kv_connector=PDConnector(store, BS, "kv_consumer",
                                                         handoff_wait_s=10.0 if written else 0.3), **kw) as cons:
        for i, p in enumerate(prompts):                 # asked first: nothing in the store yet
            cons.engine.add_request(p, params, request_id=f"w{i}", output_kind="final")
        cons.engine.step()
        assert cons.engine.scheduler.remote                # parked, waiting for remote KV
        if written:
            for i, p in enumerate(prompts):
                prod.engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=1), request_id=f"w{i}")
            while prod.engine.has_unfinished():
                prod.engine.step()
        got = {}
        while cons.engine.has_unfinished():
            got.update({o.request_id: o.outputs[0].token_ids for o in cons.engine.step() if o.finished})
        cc = cons.engine.scheduler.connector
        assert (cc.num_loaded_blocks > 0 and cc.num_failed_blocks == 0 and store.num_blocks == 0) if written \
            else (cc.num_loaded_blocks == 0 and cc.num_failed_blocks > 0)
        _no_leaks(cons)
    assert [got[f"w{i}"] for i in range(len(prompts))] == colocated[2:4]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, frequency_penalty=2.0),
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5),
    SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=7)],
    ids=["frequency_penalty", "repetition_penalty", "seeded"])
def test_seeded_and_penalised_requests_equal_colocated(tiny_llama_dir, params):
    """The first token counts for the penalties and a seed's draws run on one engine: such
    requests go to the consumer as the prompt alone (it samples the first token again)."""
    kw = dict(dtype="float32", device="cpu", block_size=BS)
    prompts = _prompts()
    with LLM(tiny_llama_dir, num_blocks=128, **kw) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    store = MemoryKVStore(BLOCK_SHAPE, torch.float32, 256)
    with LLM(tiny_llama_dir, num_blocks=64, kv_connector=PDConnector(store, BS, "kv_producer"), **kw) as prod, \
            LLM(tiny_llama_dir, num_blocks=64, kv_connector=PDConnector(store, BS, "kv_consumer"), **kw) as cons:
        got = disaggregated_generate(prod.engine, cons.engine, prompts, params)
        assert cons.engine.scheduler.connector.num_loaded_blocks > 0      # the KV still came over
        _no_leaks(prod)
        _no_leaks(cons)
        assert store.num_blocks == 0
    assert got == want
