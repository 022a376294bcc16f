"""PoolSimulator: co-located with one instance is Simulator exactly; disaggregated, every
request gets its tokens, TTFT comes from the prefill pool, and a dearer transfer delays
the second token (TPOT), never the first."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.simulator import CostModel, Simulator, make_trace, synthetic_lengths
from toolkit.simulator.disagg import PoolSimulator, compare

SETTINGS = dict(num_blocks=2048, block_size=16, max_num_batched_tokens=512)


@pytest.fixture(scope="module")
def cost():
    return CostModel.load("nvidia-h200/llama-3.1-8b")


@pytest.fixture(scope="module")
def trace():
    return make_trace(synthetic_lengths(40, seed=1, prompt_median=600, output_median=40), rate=20.0, seed=1)


def test_one_colocated_instance_is_the_simulator(cost, trace):
    a = Simulator("fcfs", cost, **SETTINGS).run(trace)
    b = PoolSimulator(cost, num_colocated=1, **SETTINGS).run(trace)
    for rid, t in a.requests.items():
        assert b.requests[rid].token_times == pytest.approx(t.token_times, abs=1e-12), rid
    assert len(a.steps) == len(b.steps)


@pytest.mark.parametrize("pools", [(1, 1), (1, 3), (2, 2)])
def test_disaggregated_requests_finish_with_their_tokens(cost, trace, pools):
    run = PoolSimulator(cost, num_prefill=pools[0], num_decode=pools[1], transfer_s_per_block=1e-4,
                        **SETTINGS).run(trace)
    for r in trace.requests:
        t = run.requests[r.request_id]
        assert len(t.token_times) == r.output_len and t.finish is not None
        assert t.token_times == sorted(t.token_times) and t.token_times[0] > r.arrival


def test_transfer_cost_moves_tpot_not_ttft(cost, trace):
    runs = [PoolSimulator(cost, num_prefill=1, num_decode=1, transfer_s_per_block=s, **SETTINGS).run(trace)
            for s in (0.0, 1e-3, 1e-2)]
    ttft = [r.values("ttft") for r in runs]
    assert all(np.allclose(ttft[0], x) for x in ttft[1:])      # prefill pool alone decides TTFT
    tpot = [float(np.mean(r.values("tpot"))) for r in runs]
    assert tpot[0] < tpot[1] < tpot[2]
    gap = [float(np.mean([t.token_times[1] - t.token_times[0] for t in r.requests.values()
                          if len(t.token_times) > 1])) for r in runs]
    blocks = np.mean([-(-r.prompt_len // 16) for r in trace.requests if r.output_len > 1])
    assert gap[2] - gap[1] >= 0.9 * blocks * (1e-2 - 1e-3)     # at least the extra transfer time


def test_compare_table_and_validation(cost, trace):
    text = compare(trace.head(10), cost, block_bytes=2 * 32 * 16 * 8 * 128 * 2, gbps=(10.0,), **SETTINGS)
    assert "2 co-located" in text and "1P+1D @ 10 GB/s" in text
    with pytest.raises(ValueError, match="num_prefill"):
        PoolSimulator(cost, num_prefill=1)
    with pytest.raises(ValueError, match="transfer_s_per_block"):
        PoolSimulator(cost, num_prefill=1, num_decode=1, transfer_s_per_block=-1)
