"""The ray backend: 2 replicas as Ray actors on a local Ray cluster. Skipped without Ray
(CI installs only .[dev,demo]); run it with

    pip install -e '.[ray]' && pytest -m ray tests/serving/test_data_parallel_ray.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

ray = pytest.importorskip("ray")

from test_data_parallel import OPTIONS, config  # noqa: E402

from toolkit import LLM, SamplingParams  # noqa: E402
from toolkit.entrypoints.data_parallel import DPAsyncEngine  # noqa: E402
from toolkit.entrypoints.replica_set import ReplicaDiedError  # noqa: E402

pytestmark = pytest.mark.ray
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def dp_ray():
    engine = DPAsyncEngine(config(), data_parallel_size=2, backend="ray", router="round_robin",
                           ray_options=dict(init_options=dict(num_cpus=4, include_dashboard=False,
                                                              log_to_driver=False),
                                            num_cpus=1, max_restarts=1), **OPTIONS)
    yield engine
    engine.close()
    ray.shutdown()


async def _collect(stream):
    ids = []
    try:
        async for d in stream.iterate("delta"):
            ids += [t for c in d.outputs for t in c.token_ids]
    except ReplicaDiedError as e:
        return ids, e
    return ids, None


def test_ray_replicas_match_one_engine(dp_ray):
    prompts = [[5, 6, 7], [9, 1], [4] * 20, [3, 3, 3]]
    with LLM(config(), **OPTIONS) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]

    async def run():
        streams = [await dp_ray.add_async(p, GREEDY) for p in prompts]
        return await asyncio.gather(*(_collect(s) for s in streams))

    assert [ids for ids, _ in asyncio.run(run())] == want
    assert [s["routed"] for s in dp_ray.replica_stats()] == [2, 2]


def test_a_lost_actor_is_restarted(dp_ray):
    long = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    victim = dp_ray.core.cores[1]

    async def run():
        streams = [await dp_ray.add_async([3 + i, 5], long) for i in range(4)]   # 1 and 3 on replica 1
        tasks = [asyncio.ensure_future(_collect(s)) for s in streams]
        while dp_ray.core.views()[1].num_running < 2:
            await asyncio.sleep(0.005)
        ray.kill(victim.actor, no_restart=False)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

    results = asyncio.run(run())
    assert [e is not None for _, e in results] == [False, True, False, True]
    assert all(len(ids) == 60 for ids, e in results if e is None)
    deadline = time.monotonic() + 120
    while not dp_ray.is_ready and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dp_ray.is_ready and victim.restarts == 1

    async def again():
        streams = [await dp_ray.add_async([7, 7], GREEDY) for _ in range(2)]
        return await asyncio.gather(*(_collect(s) for s in streams))

    assert all(len(ids) == 8 and e is None for ids, e in asyncio.run(again()))
    assert [s["routed"] for s in dp_ray.replica_stats()][1] >= 4    # the restarted replica serves


def test_losing_every_actor_at_once_waits_for_ray_and_ends_when_ray_gives_up(dp_ray):
    """One replica (as after a node failure, or -dp 1): while Ray restarts its actor the engine
    is running, not dead; once Ray will not restart it, the engine is dead."""
    from toolkit.entrypoints.core_thread import EngineDeadError

    engine = DPAsyncEngine(config(), data_parallel_size=1, backend="ray",
                           ray_options=dict(num_cpus=1, max_restarts=1), **OPTIONS)
    try:
        core = engine.core.cores[0]
        ray.kill(core.actor, no_restart=False)
        deadline = time.monotonic() + 120
        while engine.core.restarting != [0] and time.monotonic() < deadline:   # the loss seen
            time.sleep(0.01)
        assert not core.alive and engine.is_running and engine.error is None
        while not engine.is_ready and time.monotonic() < deadline:   # Ray's restart back
            time.sleep(0.1)
        assert engine.is_ready and core.restarts == 1 and engine.error is None

        async def one():
            return await _collect(await engine.add_async([7, 7], GREEDY))

        ids, e = asyncio.run(one())
        assert e is None and len(ids) == 8
        ray.kill(core.actor, no_restart=True)                         # no restart this time
        while engine.is_running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.is_running and isinstance(engine.error, EngineDeadError)
    finally:
        engine.close()
