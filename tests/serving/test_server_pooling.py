"""Pooling routes: /v1/embeddings through the real `openai` client (float and base64,
dimensions), vLLM's /v1/score and /v1/rerank, the tasks in /v1/models, 400 on a wrong task,
404 on another model's name; behind data-parallel replicas too."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")


def test_openai_embeddings_create(server):
    srv, _ = server
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    texts = ["Hello there", "A longer sentence about embeddings, ünïcödé and all."]
    got = c.embeddings.create(model="tiny", input=texts, encoding_format="float")
    b64 = c.embeddings.create(model="tiny", input=texts)          # the client asks for base64
    short = c.embeddings.create(model="tiny", input=texts[0], dimensions=16)
    assert [d.index for d in got.data] == [0, 1] and got.usage.prompt_tokens > 0
    for a, b in zip(got.data, b64.data):
        assert len(a.embedding) == 64
        assert np.allclose(a.embedding, b.embedding, atol=1e-6)
        assert abs(np.linalg.norm(a.embedding) - 1) < 1e-5
    assert len(short.data[0].embedding) == 16 and abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5
    assert not np.allclose(got.data[0].embedding, got.data[1].embedding)


def test_models_score_and_rerank(server):
    srv, _ = server
    models = httpx.get(srv.url + "/v1/models").json()
    assert models["data"][0]["tasks"] == ["generate", "embed"]
    r = httpx.post(srv.url + "/v1/score", json={"model": "tiny", "text_1": "query",
                                                "text_2": ["query", "something else"]}).json()
    assert [d["index"] for d in r["data"]] == [0, 1]
    assert abs(r["data"][0]["score"] - 1) < 1e-5 and r["data"][1]["score"] < 1
    rr = httpx.post(srv.url + "/v1/rerank", json={"model": "tiny", "query": "query", "top_n": 1,
                                                  "documents": ["something else", "query"]}).json()
    assert [x["index"] for x in rr["results"]] == [1] and rr["results"][0]["document"]["text"] == "query"


def test_wrong_task_is_a_400(make_server, tmp_path):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=40, max_position_embeddings=64),
                 add_pooling_layer=False).save_pretrained(tmp_path)
    srv, _ = make_server(str(tmp_path))
    r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 400 and "cannot generate" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert r.status_code == 400                      # no tokenizer in the folder: text refused clearly
    e = httpx.post(srv.url + "/v1/embeddings", json={"input": [[1, 5, 2], [1, 7, 9, 2]]}).json()
    assert len(e["data"]) == 2 and len(e["data"][0]["embedding"]) == 32
    assert httpx.get(srv.url + "/v1/models").json()["data"][0]["tasks"] == ["embed"]


def test_another_model_s_name_is_a_404_and_both_names_for_a_side_a_400(server):
    srv, _ = server
    for route, body in (("/v1/embeddings", {"input": "hi"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                        ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        r = httpx.post(srv.url + route, json={"model": "nope", **body})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", route
    r = httpx.post(srv.url + "/v1/score", json={"text_1": "a", "queries": "a", "text_2": "b"})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]


def test_pooling_behind_data_parallel_replicas(tiny_chat_dir):
    """Two thread replicas: /v1/models lists the one model's tasks, embeddings and scores are
    served (the tasks and the pair ids come from one replica, not a list of them)."""
    from server_util import Server, free_port

    from toolkit.entrypoints.data_parallel import DPAsyncEngine
    from toolkit.serving.app import build_app

    engine = DPAsyncEngine(tiny_chat_dir, data_parallel_size=2, backend="thread", num_blocks=64, block_size=8,
                           max_num_seqs=8)
    srv = Server(build_app(engine, model_name="tiny"), free_port())
    try:
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["tasks"] == ["generate", "embed"]
        e = httpx.post(srv.url + "/v1/embeddings", json={"model": "tiny", "input": ["a b", "c"]})
        assert e.status_code == 200 and len(e.json()["data"]) == 2
        r = httpx.post(srv.url + "/v1/score", json={"text_1": "query", "text_2": ["query", "other"]}).json()
        assert abs(r["data"][0]["score"] - 1) < 1e-5
    finally:
        srv.stop()
        engine.close()
