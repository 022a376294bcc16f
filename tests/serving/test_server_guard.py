"""Issue 54 items 5 and 9: what the server checks before it reads a body (key, Host, size),
size bounds on a request's lists, and a long preparation kept off the event loop."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest


def request(srv, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data
    finally:
        conn.close()


def completion(srv, body: dict, headers: dict | None = None):
    return request(srv, "POST", "/v1/completions", json.dumps(body).encode(), headers)


def test_the_key_is_checked_before_the_body_and_on_every_path(tiny_chat_dir, make_server):
    srv, _ = make_server(tiny_chat_dir, api_key="sk-test")
    wrong = {"Authorization": "Bearer nope"}
    status, body = request(srv, "POST", "/v1/completions", b"{not json", wrong)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"     # not a 400 for the JSON
    for path in ("/docs", "/openapi.json", "/redoc", "/v1/models"):
        assert request(srv, "GET", path)[0] == 401, path
    assert request(srv, "GET", "/health")[0] == 200
    assert request(srv, "GET", "/metrics")[0] == 200                      # open, as vLLM's
    ok = {"Authorization": "Bearer sk-test"}
    assert request(srv, "GET", "/openapi.json", headers=ok)[0] == 200


def test_protect_metrics_and_allowed_hosts(tiny_chat_dir, make_server):
    srv, _ = make_server(tiny_chat_dir, api_key="k", protect_metrics=True, allowed_hosts=["127.0.0.1"])
    assert request(srv, "GET", "/metrics")[0] == 401
    assert request(srv, "GET", "/metrics", headers={"Authorization": "Bearer k"})[0] == 200
    status, body = request(srv, "GET", "/health", headers={"Host": "evil.example:8000"})
    assert status == 400 and body["error"]["code"] == "invalid_host"      # DNS rebinding
    assert request(srv, "GET", "/health", headers={"Host": f"127.0.0.1:{srv.port}"})[0] == 200


def test_a_body_past_the_limit_is_413_before_it_is_parsed(tiny_chat_dir, make_server):
    srv, engine = make_server(tiny_chat_dir, max_body_bytes=4096)
    status, body = completion(srv, {"model": "tiny", "prompt": "x" * 10_000, "max_tokens": 1})
    assert status == 413 and body["error"]["code"] == "request_too_large" and "4096" in body["error"]["message"]
    status, _ = completion(srv, {"model": "tiny", "prompt": "hello", "max_tokens": 1})
    assert status == 200 and engine.num_unfinished == 0


@pytest.mark.parametrize("extra, param", [
    ({"logit_bias": {str(i): 1.0 for i in range(2000)}}, "logit_bias"),
    ({"stop": [f"s{i}" for i in range(100)]}, "stop"),
    ({"stop": ["y" * 5000]}, "stop"),
    ({"stop_token_ids": list(range(2000))}, "stop_token_ids"),
])
def test_request_lists_have_size_bounds(server, extra, param):
    srv, _ = server
    status, body = completion(srv, {"model": "tiny", "prompt": "hi", "max_tokens": 1, **extra})
    assert status == 400 and body["error"]["param"] == param, body


def test_text_too_long_for_the_model_is_refused_before_tokenizing(server):
    srv, engine = server
    t = time.perf_counter()
    status, body = completion(srv, {"model": "tiny", "prompt": "ab " * 400_000, "max_tokens": 1})
    assert status == 400 and "characters" in body["error"]["message"]
    status, body = request(srv, "POST", "/v1/chat/completions", json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "ab " * 400_000}]}).encode())
    assert status == 400 and "characters" in body["error"]["message"]
    assert time.perf_counter() - t < 10 and engine.num_unfinished == 0


def test_a_slow_preparation_does_not_hold_the_event_loop(tiny_chat_dir, make_server):
    """Tokenizing / rendering ran on the event loop: one long prompt held every client."""
    srv, _ = make_server(tiny_chat_dir)
    handlers = srv.server.config.app.state.handlers
    real = handlers.prepare_completion

    def slow(*a, **k):
        time.sleep(2.0)
        return real(*a, **k)
    handlers.prepare_completion = slow
    done = []
    worker = threading.Thread(target=lambda: done.append(completion(srv, {"model": "tiny", "prompt": "hi",
                                                                          "max_tokens": 1})))
    worker.start()
    time.sleep(0.3)
    t = time.perf_counter()
    assert request(srv, "GET", "/health")[0] == 200
    waited = time.perf_counter() - t
    worker.join(30)
    assert done and done[0][0] == 200
    assert waited < 1.0, f"/health waited {waited:.2f} s behind a slow preparation"
