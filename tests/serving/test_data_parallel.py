"""Data-parallel replicas (mp backend, 2 engine processes) behind one AsyncEngine interface:
the same greedy tokens as one engine, requests spread as the router says, prefix affinity
keeps a system prompt's KV on one replica, /health and /metrics per replica, and a killed
replica: its unstreamed requests finish elsewhere, its streaming ones end with a clear
error, the front keeps serving, nothing hangs; then the replica is restarted (/health 503
-> 200) and takes requests again. One replica set for the module (process start-up is the
cost); the kill runs last."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from transformers import LlamaConfig

from toolkit import LLM, SamplingParams
from toolkit.entrypoints.data_parallel import DPAsyncEngine, replica_devices
from toolkit.entrypoints.replica_set import ReplicaDiedError
from toolkit.routing import PrefixAffinityRouter, RoundRobinRouter

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
OPTIONS = dict(num_blocks=128, block_size=8, max_num_seqs=4)


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                       eos_token_id=2, bos_token_id=1)


def kv_state(engine) -> tuple[bool, int, int]:      # module level: it must pickle
    return engine.has_unfinished(), engine.allocator.num_free_blocks(), engine.allocator.num_blocks


@pytest.fixture(scope="module")
def dp():
    engine = DPAsyncEngine(config(), data_parallel_size=2, backend="mp", router="round_robin",
                           max_restarts=1, restart_backoff=0, **OPTIONS)
    yield engine
    procs = [c.proc for c in engine.core.cores]
    engine.close()
    assert not any(p.is_alive() for p in procs) and not engine.core.restarting


async def _tokens(engine, prompt, params=GREEDY) -> list[int]:
    ids = []
    async for d in engine.generate(prompt, params):
        ids += [t for c in d.outputs for t in c.token_ids]
    return ids


def _wait_idle(engine, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = engine.call(kv_state).result(timeout=timeout)
        if all(not busy and free == total for busy, free, total in states):
            return
        time.sleep(0.02)
    raise AssertionError(f"replicas still busy or holding blocks: {states}")


def test_greedy_tokens_equal_one_engine_and_round_robin_spreads(dp):
    dp.core.router = RoundRobinRouter()
    prompts = [[5, 6, 7], [9, 1], [4] * 20, [3, 3, 3], [7, 8], [11] * 9]
    with LLM(config(), **OPTIONS) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    before = [s["routed"] for s in dp.replica_stats()]

    async def run():
        return await asyncio.gather(*(_tokens(dp, p) for p in prompts))

    assert asyncio.run(run()) == want
    routed = [s["routed"] - b for s, b in zip(dp.replica_stats(), before)]
    assert routed == [3, 3]
    assert dp.num_unfinished == 0 and all(v.load == 0 for v in dp.replica_views())
    _wait_idle(dp)


def test_prefix_affinity_keeps_a_system_prompt_on_one_replica(dp):
    def cached_tokens(router, seed: int) -> int:
        """12 prompts after 3 system prompts of 4 blocks (fresh ones per run: cold caches)."""
        systems = [[(seed * 101 + s * 37 + k) % 250 + 3 for k in range(32)] for s in range(3)]
        prompts = [systems[i % 3] + [100 + i, 7] for i in range(12)]
        dp.core.router = router
        _wait_idle(dp)
        total = 0

        async def run():
            nonlocal total
            for p in prompts:                            # one at a time: the caches see each in turn
                stream = await dp.add_async(p, SamplingParams(max_tokens=2, temperature=0))
                async for out in stream.iterate("final"):
                    total += out.metrics.num_cached_tokens
        asyncio.run(run())
        return total

    rr = cached_tokens(RoundRobinRouter(), seed=1)
    pa = cached_tokens(PrefixAffinityRouter(block_size=8, prefix_blocks=4), seed=2)
    # round robin builds each system prompt on both replicas (3 systems, 2 replicas: every
    # pair meets), affinity builds it once; a hit is the system prompt's 32 tokens
    assert (rr, pa) == (6 * 32, 9 * 32)


def test_health_and_metrics_per_replica(dp):
    from fastapi.testclient import TestClient

    from toolkit.serving.app import build_app

    app = build_app(dp, model_name="tiny", close_engine=False)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4,
                                                 "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        text = client.get("/metrics").text
    assert 'toolkit_replica_alive{model_name="tiny",replica="0"} 1.0' in text
    assert 'toolkit_replica_alive{model_name="tiny",replica="1"} 1.0' in text
    assert "toolkit_replica_requests_routed_total" in text and "toolkit_num_requests_running" in text


def test_engine_calls_answer_once_for_every_replica(dp):
    """is_sleeping and reset_prefix_cache answer a bool for the set (not a list per replica),
    and a reset forgets the router's memory of the replicas' prefixes."""
    _wait_idle(dp)
    assert asyncio.run(dp.is_sleeping()) is False
    assert asyncio.run(dp.reset_prefix_cache()) is True


def test_devices_are_dealt_out_per_replica():
    assert replica_devices(2, 1, ["0", "1"]) == ["0", "1"]
    assert replica_devices(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert replica_devices(3, 1, ["0"]) == ["0", "0", "0"]          # replicas sharing one GPU
    assert replica_devices(2, 1, []) == [None, None]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="data_parallel_size"):
        DPAsyncEngine(config(), data_parallel_size=0)
    with pytest.raises(ValueError, match="backend"):
        DPAsyncEngine(config(), backend="slurm")
    with pytest.raises(ValueError, match="unknown router"):
        DPAsyncEngine(config(), router="fastest")


def test_a_killed_replica_is_routed_around(dp):
    """Replica 1 holds 4 running requests (max_num_seqs) and 1 waiting one when it is killed:
    the running ones end with ReplicaDiedError, the waiting one finishes on replica 0 with
    the right tokens, replica 0's requests are untouched, and the front keeps serving."""
    dp.core.router = RoundRobinRouter()
    _wait_idle(dp)
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    prompts = [[3 + i, 5, 9] for i in range(10)]
    with LLM(config(), **OPTIONS) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, long, use_tqdm=False)]
    victim = dp.core.cores[1].proc
    gate = threading.Event()                             # holds the restart until the checks below
    start = dp.core.factories[1]
    dp.core.factories[1] = lambda *callbacks: gate.wait(60) and start(*callbacks)

    async def run():
        streams = [await dp.add_async(p, long) for p in prompts]      # even -> replica 0, odd -> 1
        on_victim = [s.request_id for k, s in enumerate(streams) if k % 2]
        assert all(dp.replica_of(r) == 1 for r in on_victim)

        async def collect(s):
            ids = []
            try:
                async for d in s.iterate("delta"):
                    ids += [t for c in d.outputs for t in c.token_ids]
            except ReplicaDiedError as e:
                return ids, e
            return ids, None

        tasks = [asyncio.ensure_future(collect(s)) for s in streams]
        while dp.core.views()[1].num_running < 4:           # replica 1's four have streamed
            await asyncio.sleep(0.005)
        assert dp.core.views()[1].num_waiting == 1
        os.kill(victim.pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        after = await asyncio.wait_for(_tokens(dp, [5, 6, 7]), timeout=30)
        return results, after

    results, after = asyncio.run(run())
    died = [k for k, (_, e) in enumerate(results) if e is not None]
    assert len(died) == 4 and all(k % 2 for k in died)            # replica 1's streaming ones
    assert "replica 1 died" in str(results[died[0]][1])
    for k, (ids, e) in enumerate(results):
        if e is None:                                             # replica 0's five and the retried one
            assert ids == want[k]
        else:
            assert ids == want[k][:len(ids)]                      # what streamed was right
    assert sum(s["retried"] for s in dp.replica_stats()) == 1
    assert len(after) == 10 and dp.is_running and not dp.is_ready
    views = dp.replica_views()
    assert not views[1].alive and views[0].alive
    assert dp.num_unfinished == 0 and all(v.load == 0 for v in views)
    busy, free, total = dp.call(kv_state).result(timeout=20)[0]
    deadline = time.monotonic() + 20
    while (busy or free != total) and time.monotonic() < deadline:
        time.sleep(0.02)
        busy, free, total = dp.call(kv_state).result(timeout=20)[0]
    assert not busy and free == total
    _restarted_replica_serves_again(dp, victim, gate)


def _restarted_replica_serves_again(dp, victim, gate) -> None:
    """The killed replica 1 restarts (held by `gate` until now): /health 503 -> 200, and
    round robin sends it requests again, answered with one engine's greedy tokens."""
    from fastapi.testclient import TestClient

    from toolkit.serving.app import build_app

    with TestClient(build_app(dp, model_name="tiny", close_engine=False)) as client:
        assert dp.core.restarting == [1]
        assert client.get("/health").status_code == 503
        assert victim.exitcode is not None                          # the dead process was reaped
        gate.set()
        deadline = time.monotonic() + 60
        while not dp.is_ready and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.get("/health").status_code == 200
        assert dp.core.cores[1].proc.pid != victim.pid
        prompts = [[5, 6, 7], [9, 1], [4] * 20, [3, 3, 3]]
        with LLM(config(), **OPTIONS) as llm:
            want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        before = [s["routed"] for s in dp.replica_stats()]

        async def run():
            return await asyncio.gather(*(_tokens(dp, p) for p in prompts))

        assert asyncio.run(run()) == want
        assert [s["routed"] - b for s, b in zip(dp.replica_stats(), before)] == [2, 2]
        assert [s["restarts"] for s in dp.replica_stats()] == [0, 1]
        text = client.get("/metrics").text
    assert 'toolkit_replica_restarts_total{model_name="tiny",replica="1"} 1.0' in text
    assert 'toolkit_replica_alive{model_name="tiny",replica="1"} 1.0' in text
    _wait_idle(dp)
