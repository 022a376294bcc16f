"""Async scheduling (step N + 1 scheduled and launched before step N's tokens reach the host)
gives the same tokens as the synchronous loop, on the CPU in fp32: greedy and seeded
sampling, preemption, chunked prefill, prefix caching, n > 1, stop ids found one step late,
penalties (their token lists kept on the device: they overlap too), aborts while a step is
in flight."""

from __future__ import annotations

import random

import pytest

from toolkit import LLM, SamplingParams


def _prompts(n: int = 10, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 517) for _ in range(12)]
    return [(shared if i % 3 == 0 else []) + [rng.randrange(3, 517) for _ in range(rng.randrange(1, 50))]
            for i in range(n)]


def _params(n: int, penalties: bool) -> list[SamplingParams]:
    out = []
    for i in range(n):
        rng = random.Random(i)
        kind = i % (4 if penalties else 3)
        common = dict(max_tokens=rng.randrange(1, 18), stop_token_ids=list(range(3, 80, 3)))
        if kind == 0:
            out.append(SamplingParams(temperature=0, **common))
        elif kind == 1:
            out.append(SamplingParams(temperature=0.8, top_p=0.9, seed=i, **common))
        elif kind == 2:
            out.append(SamplingParams(temperature=1.0, seed=i, n=2, **common))
        else:
            out.append(SamplingParams(temperature=0, repetition_penalty=1.3, **common))
    return out


def _run(model_dir, async_scheduling: bool, penalties: bool = False, **kw):
    with LLM(model_dir, dtype="float32", device="cpu", block_size=4,
             async_scheduling=async_scheduling, **kw) as llm:
        outs = llm.generate(_prompts(), _params(10, penalties), use_tqdm=False)
        e = llm.engine
        assert e.async_scheduling == async_scheduling
        overlapped = e.num_overlapped_steps / e.num_steps
        assert overlapped > 0.5 if async_scheduling else overlapped == 0, overlapped
        assert not e.has_unfinished() and e.allocator.num_free_blocks() == e.allocator.num_blocks
        return [[(c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs], e.num_preemptions


CONFIGS = {
    "roomy": dict(num_blocks=200),
    "preempting": dict(num_blocks=30, max_num_batched_tokens=24),
    "no_prefix_cache": dict(num_blocks=200, enable_prefix_caching=False, max_num_batched_tokens=16),
    "no_chunking": dict(num_blocks=200, enable_chunked_prefill=False, max_num_seqs=3),
    "penalties": dict(num_blocks=200, max_num_seqs=4, penalties=True),
    "penalties_preempting": dict(num_blocks=30, max_num_batched_tokens=24, penalties=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_async_equals_sync(tiny_llama_dir, name):
    sync, _ = _run(tiny_llama_dir, False, **CONFIGS[name])
    fast, preempted = _run(tiny_llama_dir, True, **CONFIGS[name])
    assert fast == sync
    if name.endswith("preempting"):
        assert preempted > 0, "the small cache should preempt"
    if not name.startswith("penalties"):
        assert any(c[1] == "stop" for o in sync for c in o), "some request should stop on a stop id"


def test_abort_while_in_flight_frees_everything(tiny_llama_dir):
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64,
             async_scheduling=True) as llm:
        e = llm.engine
        ids = [e.add_request(p, SamplingParams(max_tokens=30, ignore_eos=True)) for p in _prompts(4)]
        for _ in range(3):
            e.step()
        assert e._inflight is not None
        e.abort(ids[:2])
        seen = set()
        while e.has_unfinished():
            seen.update(o.request_id for o in e.step() if o.finished)
        assert seen == set(ids[2:])
        assert e.allocator.num_free_blocks() == 64


def test_id_reused_while_its_old_step_is_in_flight(tiny_llama_dir):
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4, num_blocks=64,
             async_scheduling=True) as llm:
        want = llm.generate([[100, 101]], params, use_tqdm=False)[0].outputs[0].token_ids
        e = llm.engine
        e.add_request([5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True), request_id="r")
        e.step()
        e.step()
        assert e._inflight is not None
        e.abort("r")
        e.add_request([100, 101], params, request_id="r")
        outs = [o for _ in range(20) for o in e.step() if o.request_id == "r"]
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == want
        assert e.allocator.num_free_blocks() == 64


def test_launched_result_times_its_wait_for_the_device() -> None:
    """Launched.wait: the seconds result() blocked on the tokens' copy event (what
    StepRecord.wait_time reports); None when the tokens were on the host already."""
    import time

    import torch

    from toolkit.worker.inflight import Launched
    from toolkit.types import StepResult

    class SlowEvent:                     # stands in for the copy's CUDA event
        def synchronize(self) -> None:
            time.sleep(0.02)

    launched = Launched(None, [], None, {}, {}, {}, (torch.zeros(0, dtype=torch.int64), None, None), SlowEvent())
    assert launched.wait is None
    launched.result()
    assert launched.wait is not None and launched.wait >= 0.015
    done = Launched.done(StepResult({}))
    done.result()
    assert done.wait is None
