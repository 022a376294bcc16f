"""The pooling routes on a tensor-parallel engine (2 gloo processes on the CPU): /v1/models
lists the pooling tasks, /v1/embeddings and /v1/score give TP=1's numbers, and a completion
still runs on the same server."""

from __future__ import annotations

import httpx
import numpy as np
import torch
from server_util import Server, free_port

OPTS = dict(num_blocks=128, block_size=8, max_num_seqs=8)
TEXTS = ["Hello there", "A longer sentence about embeddings, ünïcödé and all."]


def test_pooling_routes_on_tp2_equal_tp1(tiny_chat_dir):
    from toolkit import LLM
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.serving.app import build_app

    with LLM(tiny_chat_dir, **OPTS) as tp1:
        want = [o.outputs.embedding for o in tp1.embed(TEXTS)]
        cos = tp1.score(TEXTS[0], TEXTS[1])[0].outputs.score
    engine = AsyncEngine(LLM(tiny_chat_dir, tensor_parallel_size=2, **OPTS))
    srv = Server(build_app(engine, model_name="tiny"), free_port())
    try:
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["tasks"] == ["generate", "embed"]
        got = httpx.post(srv.url + "/v1/embeddings", json={"model": "tiny", "input": TEXTS}).json()
        for d, w in zip(got["data"], want):
            assert np.allclose(d["embedding"], w, atol=1e-4)
            assert float(torch.nn.functional.cosine_similarity(torch.tensor(d["embedding"]), torch.tensor(w),
                                                               dim=0)) >= 0.9999
        r = httpx.post(srv.url + "/v1/score", json={"model": "tiny", "text_1": TEXTS[0], "text_2": TEXTS[1]})
        assert abs(r.json()["data"][0]["score"] - cos) < 1e-5
        c = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 3,
                                                          "temperature": 0}, timeout=60)
        assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 3
    finally:
        srv.stop()
