"""AsyncEngine without HTTP: deltas, n > 1, cancellation, threads, idling, failures."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.async_engine import AsyncEngine, EngineDeadError, Overloaded

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture
def engine():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                      eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    ae = AsyncEngine(LLM(cfg, num_blocks=64, block_size=8, max_num_seqs=8))
    yield ae
    ae.close()


def blocks_free(ae: AsyncEngine) -> bool:
    return ae.call(lambda e: not e.has_unfinished()
                   and e.allocator.num_free_blocks() == e.allocator.num_blocks).result()


async def collect(ae, prompt, params, **kw):
    return [o async for o in ae.generate(prompt, params, **kw)]


def test_deltas_add_up_to_the_cumulative_output(engine):
    async def run():
        deltas = await collect(engine, [5, 6, 7], GREEDY, output_kind="delta")
        cumulative = await collect(engine, [5, 6, 7], GREEDY, output_kind="cumulative")
        final = await collect(engine, [5, 6, 7], GREEDY, output_kind="final")
        return deltas, cumulative, final
    deltas, cumulative, final = asyncio.run(run())
    ids = [t for d in deltas for c in d.outputs for t in c.token_ids]
    assert ids == cumulative[-1].outputs[0].token_ids == final[0].outputs[0].token_ids
    assert len(ids) == 12 and len(final) == 1 and final[0].finished
    assert deltas[-1].finished and deltas[-1].outputs[-1].finish_reason == "length"
    # cumulative outputs only grow
    lens = [len(o.outputs[0].token_ids) for o in cumulative]
    assert lens == sorted(lens)


def test_n2_deltas_carry_their_completion_index(engine):
    async def run():
        return await collect(engine, [9, 8], SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=3,
                                                           ignore_eos=True))
    outs = asyncio.run(run())
    per = {0: [], 1: []}
    for o in outs:
        for c in o.outputs:
            per[c.index] += c.token_ids
    assert len(per[0]) == 6 and len(per[1]) == 6
    assert outs[-1].finished


def test_bad_input_raises_at_the_caller_and_queues_nothing(engine):
    async def run():
        with pytest.raises(ValueError, match="prompt token ids must be in"):
            await engine.add_async([10_000], GREEDY)
        with pytest.raises(TypeError):
            await engine.add_async([1, 2], {"max_tokens": 3})
        await engine.add_async([1, 2], GREEDY, request_id="dup")
        with pytest.raises(ValueError, match="already in use"):
            await engine.add_async([1, 2], GREEDY, request_id="dup")
    asyncio.run(run())
    deadline = time.monotonic() + 10
    while engine.num_unfinished and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocks_free(engine)


def test_leaving_the_loop_early_aborts_and_frees(engine):
    async def run():
        agen = engine.generate([3, 4, 5], SamplingParams(max_tokens=200, ignore_eos=True))
        async for _ in agen:
            break
        await agen.aclose()

        async def consume():
            async for _ in engine.generate([3, 4, 5], SamplingParams(max_tokens=200, ignore_eos=True)):
                pass
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(run())
    deadline = time.monotonic() + 10
    while not blocks_free(engine) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocks_free(engine) and engine.num_unfinished == 0


def test_abort_from_another_thread_ends_the_stream(engine):
    async def run():
        stream = await engine.add_async([3, 4], SamplingParams(max_tokens=200, ignore_eos=True),
                                        request_id="victim")
        threading.Thread(target=engine.abort, args=("victim",)).start()
        outs = [o async for o in stream.iterate("cumulative")]
        return outs[-1]
    last = asyncio.run(run())
    assert last.finished and last.finish_reason == "abort"
    assert len(last.outputs[0].token_ids) < 200


def test_threads_and_event_loops_at_once(engine):
    """Requests from several threads, each with its own event loop, all complete with the
    outputs one request alone gives (greedy)."""
    alone = asyncio.run(collect(engine, [7, 7, 7], GREEDY, output_kind="final"))[0].outputs[0].token_ids
    results: list = []

    def worker():
        outs = asyncio.run(collect(engine, [7, 7, 7], GREEDY, output_kind="final"))
        results.append(outs[0].outputs[0].token_ids)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [alone] * 6
    # and the blocking form from a plain thread
    assert engine.add([7, 7, 7], GREEDY).result(timeout=30).outputs[0].token_ids == alone


def test_idle_loop_does_not_step(engine):
    asyncio.run(collect(engine, [1, 2], GREEDY))
    steps = engine.num_steps
    time.sleep(0.3)
    assert engine.num_steps == steps          # nothing to do: the loop sleeps, no empty steps


def test_max_pending_refuses_with_overloaded():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=100, max_position_embeddings=128)
    with AsyncEngine(LLM(cfg, num_blocks=32, block_size=8), max_pending=2) as ae:
        long = SamplingParams(max_tokens=100, ignore_eos=True)
        a, b = ae.add([1, 2], long), ae.add([1, 3], long)
        with pytest.raises(Overloaded, match="max_pending=2"):
            ae.add([1, 4], long)
        ae.abort(a.request_id)
        ae.abort(b.request_id)


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine):
    runner = engine.engine.runner
    real = runner.execute_model
    calls = {"n": 0}

    def broken(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected step failure")
        return real(*a, **kw)

    runner.execute_model = broken
    try:
        async def run():
            with pytest.raises(RuntimeError, match="injected"):
                await collect(engine, [4, 4], GREEDY)
            return await collect(engine, [4, 4], GREEDY, output_kind="final")
        out = asyncio.run(run())
    finally:
        runner.execute_model = real
    assert out[0].finished and len(out[0].outputs[0].token_ids) == 12
    assert blocks_free(engine)


def test_close_aborts_and_refuses_new_requests(engine):
    stream = engine.add([5, 5], SamplingParams(max_tokens=250, ignore_eos=True))
    engine.close()
    assert stream.result(timeout=10).finish_reason == "abort"
    with pytest.raises(EngineDeadError):
        engine.add([5, 5], GREEDY)
