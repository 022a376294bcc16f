"""The server through the real `openai` client (sync and async) on a loopback port."""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai")


def client(server, **kw):
    srv, _ = server
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, **kw)


def aclient(server):
    srv, _ = server
    return openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def wait_all_free(engine, timeout=10.0):
    """Every KV block free (cached blocks count as free) once the engine is idle."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = engine.call(lambda e: (e.has_unfinished(), e.allocator.num_free_blocks(),
                                      e.allocator.num_blocks)).result()
        if not snap[0] and snap[1] == snap[2]:
            return
        time.sleep(0.02)
    raise AssertionError(f"blocks still held: unfinished={snap[0]} free={snap[1]}/{snap[2]}")


def test_completion_and_usage(server):
    c = client(server)
    r = c.completions.create(model="tiny", prompt="Hello there", max_tokens=7, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_chat_streaming_equals_non_streaming(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Name a colour."}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 == full.usage.completion_tokens


def test_n2_logprobs_and_seed(server):
    c = client(server)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, n=2,
              temperature=1.0, seed=7, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    assert [ch.index for ch in a.choices] == [0, 1]
    assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
    for ch in a.choices:
        lp = ch.logprobs.content
        assert len(lp) == 5 and all(len(t.top_logprobs) == 3 for t in lp)
        for t in lp:                       # the top list is sorted and the sampled token's logprob is real
            vals = [x.logprob for x in t.top_logprobs]
            assert vals == sorted(vals, reverse=True) and t.logprob <= 0.0
    assert a.usage.completion_tokens == 10


def test_stop_string_cuts_text(server):
    c = client(server)
    base = c.completions.create(model="tiny", prompt="a b c", max_tokens=10, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 4
    stop = base[2:4]
    r = c.completions.create(model="tiny", prompt="a b c", max_tokens=10, temperature=0, stop=[stop],
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == base[: base.find(stop)] and r.choices[0].finish_reason == "stop"
    # streamed: the held-back tail never shows, and the pieces add up to the same text
    parts = [ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="a b c", max_tokens=10, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True}) if ch.choices]
    assert "".join(parts) == r.choices[0].text


def test_response_format_json_schema_validates(server):
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("outlines_core")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "A person as JSON"}], max_tokens=60,
        temperature=0.8, seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_errors_are_openai_errors(server):
    c = client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="nope", prompt="x", max_tokens=2)
    assert "nope" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"frobnicate": 1})
    assert "frobnicate" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="x " * 600, max_tokens=2)
    assert "context length" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    # the server still serves
    assert c.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens >= 1


def test_malformed_json_and_models_and_metrics(server):
    import urllib.error
    import urllib.request

    srv, _ = server
    req = urllib.request.Request(srv.url + "/v1/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "error" in json.loads(e.value.read())
    assert [m.id for m in client(server).models.list().data] == ["tiny"]
    assert urllib.request.urlopen(srv.url + "/health").status == 200
    text = urllib.request.urlopen(srv.url + "/metrics").read().decode()
    for name in ("toolkit_time_to_first_token_seconds", "toolkit_num_requests_running",
                 "toolkit_kv_cache_usage_perc", "toolkit_request_success_total",
                 "toolkit_prefix_cache_hits_total"):
        assert name in text


def test_async_client_concurrent_greedy_stream_equals_plain(server):
    """Many concurrent streams through the async client: each streamed text equals its
    non-streamed twin, and afterwards every KV block is free."""
    srv, engine = server
    prompts = [f"Count to {i}:" for i in range(24)]

    async def run():
        c = aclient(server)
        async def one(p):
            full = await c.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True})
            parts = []
            async for ch in await c.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                                       stream=True, extra_body={"ignore_eos": True}):
                parts.extend(x.text for x in ch.choices)
            return full.choices[0].text, "".join(parts)
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await c.close()

    for full, streamed in asyncio.run(run()):
        assert full == streamed
    wait_all_free(engine)


def test_disconnect_mid_stream_aborts_and_frees(server):
    srv, engine = server
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    body = json.dumps({"model": "tiny", "prompt": "go", "max_tokens": 400, "stream": True,
                       "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.readline()                          # one event arrived: the request is running
    conn.sock.close()
    conn.close()
    wait_all_free(engine)
    assert engine.num_unfinished == 0
    import urllib.request

    metrics = urllib.request.urlopen(srv.url + "/metrics").read().decode()
    assert 'finished_reason="abort"' in metrics       # aborted, not run to its 400 tokens
