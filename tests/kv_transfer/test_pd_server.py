"""Prefill/decode disaggregation over HTTP: a producer server, a consumer server (separate
engines and separate disk stores over one handoff directory, as two processes would have)
and the proxy in front; the answer equals a co-located engine's greedy tokens, and the
consumer loaded the handoff. Also: --kv-role / --kv-cache-dir reach the engine options."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx

from toolkit import LLM, SamplingParams

BS = 4
PROMPTS = [[(17 * j) % 450 + 40 for j in range(22)] + [7, 8, 9], [(5 * j) % 300 + 30 for j in range(17)]]


class _Server:
    def __init__(self, app) -> None:
        import socket

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the test server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def test_proxy_over_two_servers_equals_colocated(tiny_llama_dir, tmp_path):
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.kv_transfer.http_proxy import build_proxy_app
    from toolkit.serving.app import build_app

    kw = dict(dtype="float32", device="cpu", block_size=BS, num_blocks=64)
    with LLM(tiny_llama_dir, **kw) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(
            PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)]
    # the consumer as `serve --kv-role consumer` builds it: it waits for a handoff still being written
    engines = [AsyncEngine(LLM(tiny_llama_dir, kv_connector="pd", kv_role=role, kv_cache_dir=str(tmp_path),
                               kv_handoff_wait_s=10.0 if role == "kv_consumer" else 0.0, **kw))
               for role in ("kv_producer", "kv_consumer")]
    servers = [_Server(build_app(e, model_name="tiny")) for e in engines]
    proxy = _Server(build_proxy_app(servers[0].url, servers[1].url))
    try:
        got = []
        for p in PROMPTS:
            r = httpx.post(proxy.url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": p, "max_tokens": 6, "temperature": 0.0,
                                 "ignore_eos": True, "logprobs": 0})
            assert r.status_code == 200, r.text
            got.append([int(t) for t in r.json()["choices"][0]["logprobs"]["tokens"]])
        cons = engines[1].engine.scheduler.connector
        assert cons.num_loaded_blocks > 0 and engines[0].engine.scheduler.connector.num_handoffs == 2
    finally:
        for s in [proxy, *servers]:
            s.stop()
    assert got == want


def test_serve_flags_reach_the_engine_options():
    from toolkit.serve import engine_options, parse_args

    opts = engine_options(parse_args(["m", "--kv-role", "consumer", "--kv-cache-dir", "/dev/shm/pd"]))
    assert opts["kv_connector"] == "pd" and opts["kv_role"] == "kv_consumer" and opts["kv_cache_dir"] == "/dev/shm/pd"
    assert opts["kv_handoff_wait_s"] == 10.0
    assert "kv_handoff_wait_s" not in engine_options(parse_args(["m", "--kv-role", "producer"]))
    opts = engine_options(parse_args(["m", "--kv-cache-dir", "/data/kv"]))
    assert "kv_connector" not in opts and opts["kv_cache_dir"] == "/data/kv"
