"""Server behaviour around the requests: API keys, backpressure, shutdown, load, and the
embedded real model where meaning matters (chat template, stop strings)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")


def post(url: str, body: dict, headers: dict | None = None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_api_key_is_required_on_v1(tiny_chat_dir, make_server):
    srv, _ = make_server(tiny_chat_dir, api_key="sk-test")
    try:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0)
        assert good.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        assert urllib.request.urlopen(srv.url + "/health").status == 200    # health needs no key
    finally:
        srv.stop()


def test_backpressure_503_with_retry_after_then_shutdown_frees_everything(tiny_chat_dir, make_server):
    srv, engine = make_server(tiny_chat_dir, max_pending=2, shutdown_timeout=0.5)
    try:
        long = {"model": "tiny", "prompt": "x", "max_tokens": 300, "ignore_eos": True}
        for _ in range(2):                    # two requests hold the queue (added directly)
            engine.add([5, 6, 7], __import__("toolkit").SamplingParams(max_tokens=400, ignore_eos=True))
        status, headers, body = post(srv.url + "/v1/completions", long)
        assert status == 503 and headers.get("retry-after") == "1"
        assert body["error"]["code"] == "overloaded"
    finally:
        srv.stop()                            # graceful: aborts what runs, closes the engine
    assert not engine.is_running and engine.engine.closed


def test_load_100_concurrent_streams(tiny_chat_dir, make_server):
    """100 concurrent streaming requests through the async client: all complete, greedy
    streamed text equals the non-streamed text, and every KV block is free afterwards."""
    srv, engine = make_server(tiny_chat_dir)
    try:
        prompts = [f"Item {i}: the" for i in range(100)]
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        plain = c.completions.create(model="tiny", prompt=prompts, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
        want = {ch.index: ch.text for ch in plain.choices}

        async def run():
            ac = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)

            async def one(p):
                parts = []
                async for ch in await ac.completions.create(model="tiny", prompt=p, max_tokens=6,
                                                            temperature=0, stream=True,
                                                            extra_body={"ignore_eos": True}):
                    parts.extend(x.text for x in ch.choices)
                return "".join(parts)
            try:
                return await asyncio.gather(*(one(p) for p in prompts))
            finally:
                await ac.close()

        got = asyncio.run(run())
        assert got == [want[i] for i in range(100)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            idle, free, total = engine.call(lambda e: (not e.has_unfinished(), e.allocator.num_free_blocks(),
                                                       e.allocator.num_blocks)).result()
            if idle and free == total:
                break
            time.sleep(0.02)
        assert idle and free == total
    finally:
        srv.stop()


@pytest.mark.slow
def test_embedded_model_chat_and_stop_string(make_server):
    """The real SmolLM2 through its own chat template: a sensible greedy answer, and a stop
    string that cuts it where it first appears."""
    from toolkit.models import default_model_path

    srv, _ = make_server(str(default_model_path()))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
        text = r.choices[0].message.content
        assert "Paris" in text and "<|im_end|>" not in text and r.choices[0].finish_reason == "stop"
        cut = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0,
                                        stop=["Paris"])
        assert cut.choices[0].message.content == text[: text.index("Paris")]
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=24, temperature=0, stop=["Paris"], stream=True)
            if ch.choices)
        assert streamed == cut.choices[0].message.content
    finally:
        srv.stop()


def test_a_failing_step_is_a_500_error_body_and_the_server_goes_on(tiny_chat_dir, make_server):
    srv, engine = make_server(tiny_chat_dir)
    runner = engine.engine.runner
    real, calls = runner.execute_model, {"n": 0}

    def broken(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected step failure")
        return real(*a, **kw)

    runner.execute_model = broken
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4}
    status, _, out = post(srv.url + "/v1/completions", body)
    assert status == 500 and "injected step failure" in out["error"]["message"]
    assert out["error"]["type"] == "server_error"
    status, _, out = post(srv.url + "/v1/completions", body)
    assert status == 200 and out["usage"]["completion_tokens"] >= 1
