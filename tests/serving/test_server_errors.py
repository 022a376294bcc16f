"""Issue 54 item 8: bodies the server cannot use get a 400 with OpenAI's error body (never a
500, a dropped connection or FastAPI's {"detail": ...}), and messages name the request's
fields, not the toolkit's functions."""

from __future__ import annotations

import http.client
import json

import pytest


def raw(srv, path: str, body: bytes, method: str = "POST"):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _openai_error(body) -> dict:
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    return err


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 1}'),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\udfffb"}]}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "stop": ["\\ud800"], "max_tokens": 1}'),
])
def test_a_lone_surrogate_is_a_400(server, path, body):
    srv, engine = server
    status, got = raw(srv, path, body)
    err = _openai_error(got)
    assert status == 400 and "surrogate" in err["message"], got
    assert raw(srv, "/v1/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}')[0] == 200
    assert engine.num_unfinished == 0


@pytest.mark.parametrize("body", [b"\xff\xfe{}", b'{"prompt": "\xc3("}', b"[" * 100_000 + b"]" * 100_000])
def test_undecodable_bodies_get_openai_error_bodies(server, body):
    srv, _ = server
    status, got = raw(srv, "/v1/completions", body)
    assert status == 400
    _openai_error(got)


def test_unknown_routes_and_methods_get_openai_error_bodies(server):
    srv, _ = server
    status, got = raw(srv, "/v1/nothing", b"{}")
    assert status == 404
    _openai_error(got)
    status, got = raw(srv, "/v1/completions", b"", method="GET")
    assert status == 405
    _openai_error(got)


@pytest.mark.parametrize("key", ["add_generation_prompt", "messages", "tokenizer"])
def test_chat_template_kwargs_that_collide_name_the_field(server, key):
    srv, _ = server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {key: True}}
    status, got = raw(srv, "/v1/chat/completions", json.dumps(body).encode())
    err = _openai_error(got)
    assert status == 400 and err["param"] == "chat_template_kwargs" and key in err["message"]
    assert "toolkit." not in err["message"] and "()" not in err["message"], err


# -- item 9: strict types, no lax coercion --
@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": "10"}, "max_tokens"), ({"max_tokens": True}, "max_tokens"), ({"n": "2"}, "n"),
    ({"stream": "yes"}, "stream"), ({"prompt": [True, False]}, "prompt"),
    ({"logit_bias": {" 5": 1.0}}, "logit_bias"), ({"logit_bias": {"5_0": 1.0}}, "logit_bias"),
    ({"temperature": "0.5"}, "temperature"),
])
def test_lax_coercions_are_refused(server, extra, param):
    srv, _ = server
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, **extra}
    status, got = raw(srv, "/v1/completions", json.dumps(body).encode())
    err = _openai_error(got)
    assert status == 400 and param in err["message"], got


def test_infinity_is_refused(server):
    srv, _ = server
    status, got = raw(srv, "/v1/completions", b'{"model": "tiny", "prompt": "hi", "temperature": Infinity}')
    assert status == 400 and "temperature" in _openai_error(got)["message"]
