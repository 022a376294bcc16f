"""The job class in the scheduler and the simulator: pooling requests are prefill-only (they
finish when their prompt is computed, sampling nothing), share steps and the token budget with
generation, free their blocks, and bidirectional ones are never chunked."""

from __future__ import annotations

from toolkit.blocks.free_list import FreeListAllocator
from toolkit.pooling import PoolingParams
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.static import StaticBatchingScheduler
from toolkit.simulator import Simulator, Trace, TraceRequest
from toolkit.types import Request, SamplingParams


def run(sched, requests):
    for r in requests:
        sched.add_request(r)
    log, finished = [], {}
    while sched.has_unfinished():
        out = sched.schedule()
        log.append({s.request_id: (s.num_new_tokens, s.samples) for s in out.scheduled})
        toks = {s.request_id: [7] for s in out.scheduled if s.samples}
        for o in sched.update(out, toks):
            if o.finished:
                finished[o.request_id] = o
    return log, finished


def test_pooling_requests_are_prefill_only_and_share_the_budget():
    alloc = FreeListAllocator(64, 4)
    sched = ContinuousBatchingScheduler(alloc, block_size=4, max_num_batched_tokens=8)
    reqs = [Request("g", list(range(1, 6)), SamplingParams(max_tokens=4)),
            Request("e", list(range(1, 20)), pooling_params=PoolingParams(task="embed"))]
    log, finished = run(sched, reqs)
    assert finished["e"].new_token_ids == [] and finished["e"].finish_reason == "stop"
    assert reqs[1].output_token_ids == [] and reqs[1].num_computed_tokens == 19
    assert not any(step.get("e", (0, False))[1] for step in log)          # never samples
    assert sum(step["e"][0] for step in log if "e" in step) == 19          # chunked: 19 tokens in all
    assert any("e" in step and "g" in step for step in log)                # steps shared
    assert all(sum(n for n, _ in step.values()) <= 8 for step in log)      # one budget
    assert reqs[0].num_output_tokens == 4 and finished["g"].finish_reason == "length"
    assert alloc.num_free_blocks() == 64


def test_bidirectional_prompts_run_whole():
    for cls in (ContinuousBatchingScheduler, StaticBatchingScheduler):
        alloc = FreeListAllocator(64, 4)
        sched = cls(alloc, block_size=4, max_num_batched_tokens=8)
        reqs = [Request(f"e{i}", list(range(1, 2 + i * 3)), pooling_params=PoolingParams(), prefill_whole=True)
                for i in range(3)]
        log, _ = run(sched, reqs)
        for r in reqs:
            grants = [step[r.request_id][0] for step in log if r.request_id in step]
            assert grants == [r.num_prompt_tokens], (cls, grants)
        too_long = Request("x", list(range(1, 12)), pooling_params=PoolingParams(), prefill_whole=True)
        _, fin = run(sched, [too_long])
        assert fin["x"].finish_reason == "rejected"
        assert alloc.num_free_blocks() == 64


def test_simulator_runs_a_mixed_trace():
    reqs = [TraceRequest(f"g{i}", i * 0.01, list(range(1, 40)), 20) for i in range(4)]
    reqs += [TraceRequest(f"e{i}", i * 0.01, list(range(1, 60)), 0, task="embed") for i in range(4)]
    sim = Simulator(cost=lambda out: 1e-3 * (1 + out.total_num_scheduled_tokens / 64), num_blocks=256,
                    max_num_batched_tokens=64)
    result = sim.run(Trace(reqs))
    for i in range(4):
        e, g = result.requests[f"e{i}"], result.requests[f"g{i}"]
        assert e.finish is not None and e.token_times == [] and e.finish_reason == "stop"
        assert len(g.token_times) == 20
