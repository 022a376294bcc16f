"""examples/priority_server.py: a gold key's request overtakes the free tier's queue."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")


def load_example():
    path = Path(__file__).resolve().parents[2] / "examples" / "priority_server.py"
    spec = importlib.util.spec_from_file_location("priority_server", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gold_key_overtakes_queued_free_requests(tiny_chat_dir):
    from server_util import Server, free_port

    from toolkit import LLM
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.schedulers.policies import Priority

    example = load_example()
    engine = AsyncEngine(LLM(tiny_chat_dir, num_blocks=128, block_size=8, max_num_seqs=1,
                             policy=Priority()))
    srv = Server(example.build_priority_app(engine, {"gold": 0, "free": 5}, "tiny"), free_port())
    order: list[str] = []

    async def run():
        def client(key):
            return openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)

        async def one(key, tag):
            c = client(key)
            try:
                await c.completions.create(model="tiny", prompt="go", max_tokens=30,
                                           extra_body={"ignore_eos": True})
            finally:
                await c.close()
            order.append(tag)

        free = [asyncio.create_task(one("free", f"free{i}")) for i in range(4)]
        deadline = time.monotonic() + 60       # all four taken: one running, three waiting
        while engine.num_unfinished < 4:
            assert time.monotonic() < deadline and not order, f"free requests not queued: {order}"
            await asyncio.sleep(0.005)
        gold = asyncio.create_task(one("gold", "gold"))
        with pytest.raises(openai.AuthenticationError):
            await client("nobody").completions.create(model="tiny", prompt="x", max_tokens=2)
        await asyncio.gather(gold, *free)

    try:
        asyncio.run(run())
    finally:
        srv.stop()
    # one runs at a time: the gold request goes next after the one running when it came
    # (FCFS would put it last, index 4)
    assert order.index("gold") <= 1, order
