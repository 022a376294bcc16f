"""Issue 54 item 6: a sampler fault of one request's row ends only that request. A user's
stage raising for one row used to end every unfinished request of the step; now the runner
finds the row (each row sampled alone) and raises a RequestFault naming its request, the
others are scheduled again and finish with the tokens they get alone, and nothing leaks."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.async_engine import AsyncEngine
from toolkit.samplers.pipeline import Sampler

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
BAD = 99                     # a prompt ending with this token makes the stage raise for its row
OPTIONS = {"num_blocks": 64, "block_size": 8, "max_num_seqs": 8}


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                       eos_token_id=2, bos_token_id=1)


class RaisesForOneRow:
    """A user's stage: logits unchanged, but a row whose prompt ends with BAD raises once it
    has `after` output tokens (so the fault comes mid-decode, not at the first step)."""

    name = "raises_for_one_row"

    def __init__(self, after: int = 2) -> None:
        self.after = after

    def __call__(self, logits, meta):
        for p, o in zip(meta.prompt_token_ids, meta.output_token_ids):
            if int(p[-1]) == BAD and len(o) >= self.after:
                raise ZeroDivisionError("the user's stage broke on this row")
        return logits


def sampler() -> Sampler:                            # module level: it must pickle (process mode)
    return Sampler().insert_before("temperature", RaisesForOneRow())


def kv_state(engine) -> tuple[bool, int, int]:
    return engine.has_unfinished(), engine.allocator.num_free_blocks(), engine.allocator.num_blocks


def prompts() -> list[list[int]]:
    return [[5, 6, 7 + i, 8 + 2 * i] for i in range(5)]


def alone() -> list[list[int]]:
    torch.manual_seed(0)
    with LLM(config(), **OPTIONS) as llm:
        return [llm.generate([p], PARAMS, use_tqdm=False)[0].outputs[0].token_ids for p in prompts()]


async def _collect(ae: AsyncEngine, p: list[int], rid: str) -> list[int]:
    ids = []
    async for d in ae.generate(p, PARAMS, request_id=rid):
        ids += d.outputs[0].token_ids
    return ids


def _run(ae: AsyncEngine) -> None:
    want = alone()

    async def run():
        bad = asyncio.ensure_future(_collect(ae, [5, 6, BAD], "bad"))
        good = [asyncio.ensure_future(_collect(ae, p, f"ok{i}")) for i, p in enumerate(prompts())]
        return await asyncio.gather(*good, bad, return_exceptions=True)
    *good, bad = asyncio.run(run())
    # (the process core's errors cross the pipe as a RuntimeError with the message)
    assert isinstance(bad, RuntimeError) and "'bad'" in str(bad) and "ZeroDivisionError" in str(bad), bad
    assert good == want
    deadline = time.monotonic() + 20
    while (state := ae.call(kv_state).result(timeout=20)) != (False, OPTIONS["num_blocks"], OPTIONS["num_blocks"]):
        assert time.monotonic() < deadline, f"left behind: {state}"
        time.sleep(0.02)
    assert ae.is_running


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stage_raising_for_one_row_ends_only_its_request(async_scheduling):
    torch.manual_seed(0)
    ae = AsyncEngine(LLM(config(), sampler=sampler(), async_scheduling=async_scheduling, **OPTIONS))
    try:
        _run(ae)
        # async: the fault came while the step before was in flight (its tokens not landed)
        assert (ae.call(lambda e: e.num_overlapped_steps).result(timeout=20) > 0) == async_scheduling
    finally:
        ae.close()


def test_in_the_engine_process_too():
    torch.manual_seed(0)
    ae = AsyncEngine.build(config(), process=True, sampler=sampler(), **OPTIONS)
    try:
        _run(ae)
    finally:
        ae.close()


def test_a_sampler_broken_for_every_row_still_ends_every_request():
    """No single row is at fault: the old behaviour, every request ends with the error."""
    from toolkit.samplers.base import SamplingMetadata
    from toolkit.worker.sample_fault import attribute_fault

    def broken(logits, meta, **_):
        raise KeyError("all rows")
    meta = SamplingMetadata.build([PARAMS] * 2, [[1], [2]], [[], []], 10, torch.device("cpu"))
    err = KeyError("x")
    assert attribute_fault(broken, torch.zeros(2, 10), meta, ["a", "b"], err) is err


def test_a_grammar_that_ended_in_a_failed_step_ends_its_request_in_the_next():
    """advance() gave the grammars the last tokens before the sampling failed; a grammar that
    ended there is reported by the next step (advance has nothing left to give it)."""
    from types import SimpleNamespace

    from toolkit.engine.engine import Engine

    x, y = SimpleNamespace(request_id="x"), SimpleNamespace(request_id="y")
    ends = iter([{"x": "stop"}, {}])
    seen = []

    def sample_tokens(fwd, grammars, ended):
        seen.append(dict(ended))
        if len(seen) == 1:
            raise RuntimeError("y's row broke")
        return "launched"
    eng = SimpleNamespace(
        runner=SimpleNamespace(execute_model=lambda out, prev: SimpleNamespace(batch=SimpleNamespace(sampling=[x, y])),
                               sample_tokens=sample_tokens),
        structured=SimpleNamespace(advance=lambda reqs: next(ends), grammars={"x": object()}),
        _inflight=None, _undelivered=[], _ended_unsampled={})
    with pytest.raises(RuntimeError):
        Engine._launch(eng, None, [])
    assert Engine._launch(eng, None, []) == "launched"
    assert seen == [{"x": "stop"}, {"x": "stop"}] and eng._ended_unsampled == {}
