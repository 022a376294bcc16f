"""AsyncEngine with the engine in its own process: same outputs as in-process, errors cross
the pipe, aborts free blocks, a killed engine process fails every stream (no hang)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.async_engine import AsyncEngine, EngineDeadError

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
OPTIONS = dict(num_blocks=64, block_size=8, max_num_seqs=8)


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                       eos_token_id=2, bos_token_id=1)


def kv_state(engine) -> tuple[bool, int, int]:      # module level: it must pickle
    return engine.has_unfinished(), engine.allocator.num_free_blocks(), engine.allocator.num_blocks


def wait_free(ae: AsyncEngine) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        busy, free, total = ae.call(kv_state).result(timeout=20)
        if not busy and free == total:
            return
        time.sleep(0.02)
    raise AssertionError(f"blocks held: {total - free}")


@pytest.fixture(scope="module")
def proc():
    ae = AsyncEngine.build(config(), process=True, **OPTIONS)
    yield ae
    ae.close()


def test_same_tokens_as_in_process(proc):
    prompts = [[5, 6, 7], [9, 1], [4] * 20]
    with LLM(config(), **OPTIONS) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]

    async def run():
        async def one(p):
            ids = []
            async for d in proc.generate(p, GREEDY):
                ids += [t for c in d.outputs for t in c.token_ids]
            return ids
        return await asyncio.gather(*(one(p) for p in prompts))
    assert asyncio.run(run()) == want
    final = proc.add([5, 6, 7], GREEDY).result(timeout=30)
    assert final.outputs[0].token_ids == want[0] and final.prompt_token_ids == [5, 6, 7]


def test_errors_cross_the_pipe_and_aborts_free(proc):
    with pytest.raises(ValueError, match="prompt token ids must be in"):
        proc.add([1000], GREEDY)
    records = []
    proc.add_step_observer(records.append)

    async def run():
        agen = proc.generate([3, 4], SamplingParams(max_tokens=200, ignore_eos=True))
        async for _ in agen:
            break
        await agen.aclose()
    asyncio.run(run())
    wait_free(proc)
    proc.remove_step_observer(records.append)
    assert records and records[0].scheduler_output is None and records[0].kv_blocks_total == 64
    assert proc.num_unfinished == 0


def test_a_cancelled_add_leaves_the_reader_alive(proc):
    """Issue 54 item 1: the caller of add_async gives up (cancelled) before the engine's
    reply; the reply must not kill the reader thread (InvalidStateError on a cancelled
    future), and the request that may have reached the engine is aborted."""
    async def run():
        for _ in range(3):
            t = asyncio.create_task(proc.add_async([5, 6], SamplingParams(max_tokens=50, ignore_eos=True)))
            await asyncio.sleep(0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
        return [o async for o in proc.generate([5, 6, 7], GREEDY)]
    outs = asyncio.run(run())
    assert outs[-1].finished and proc.is_running
    assert proc.core._reader.is_alive()
    wait_free(proc)
    assert proc.num_unfinished == 0 and not proc.core._acc


def test_a_refused_add_leaves_no_accumulator(proc):
    """Issue 54 item 9: ProcessCore._acc kept an entry for every refused add."""
    for _ in range(3):
        with pytest.raises(ValueError, match="prompt token ids must be in"):
            proc.add([1000], GREEDY)
    assert not proc.core._acc and not proc.core._futures


def test_a_killed_engine_process_fails_streams_not_hangs(proc):
    """Last in this file: it kills the module's engine process (one spawn less in CI)."""
    stream = proc.add([5, 5], SamplingParams(max_tokens=250, ignore_eos=True))
    os.kill(proc.core.proc.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError, match="exited unexpectedly"):
        stream.result(timeout=30)
    with pytest.raises(EngineDeadError):
        proc.add([5, 5], GREEDY)
    assert not proc.is_running
