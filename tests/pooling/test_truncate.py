"""truncate_prompt_tokens (vLLM's PoolingParams field and LLM.embed argument): k keeps the
prompt's last k tokens, -1 the last max_model_len; None refuses an over-long prompt; through
LLM.embed / classify / score and the server's /v1/embeddings and /v1/score."""

from __future__ import annotations

import pytest
import torch

from toolkit import LLM
from toolkit.pooling import PoolingParams

LONG = [1] + [(7 * i) % 200 + 3 for i in range(90)] + [2]     # 92 ids; the tiny BERT holds 64


@pytest.fixture(scope="module")
def llm(checkpoint):
    _, folder = checkpoint("bert")
    return LLM(str(folder), block_size=4, num_blocks=64, attention="torch")


def test_keeps_the_last_tokens(llm, checkpoint):
    hf, _ = checkpoint("bert")
    assert llm.engine.max_model_len == 64
    with pytest.raises(ValueError, match="max_model_len=64"):
        llm.embed([LONG])
    cut, whole = llm.embed([LONG, LONG[-10:]], truncate_prompt_tokens=10)
    assert cut.prompt_token_ids == LONG[-10:]
    torch.testing.assert_close(torch.tensor(cut.outputs.embedding), torch.tensor(whole.outputs.embedding))
    with torch.no_grad():
        want = torch.nn.functional.normalize(hf(torch.tensor([LONG[-10:]])).last_hidden_state[0, 0], dim=0)
    torch.testing.assert_close(torch.tensor(cut.outputs.embedding), want, rtol=1e-4, atol=1e-5)
    full = llm.embed([LONG], PoolingParams(truncate_prompt_tokens=-1))[0]
    assert full.prompt_token_ids == LONG[-64:]
    short = llm.embed([LONG[:5]], truncate_prompt_tokens=10)[0]        # shorter than k: unchanged
    assert short.prompt_token_ids == LONG[:5]
    s = llm.score(LONG, [LONG[:6]], truncate_prompt_tokens=-1)[0]     # a bi-encoder: each side cut
    assert len(s.prompt_token_ids) == 64 + 6
    assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks


def test_bad_values_are_refused(llm):
    for bad in (0, -2):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            PoolingParams(truncate_prompt_tokens=bad)
    for bad in (True, 3.0):
        with pytest.raises(TypeError, match="truncate_prompt_tokens"):
            PoolingParams(truncate_prompt_tokens=bad)
    with pytest.raises(ValueError, match="more than max_model_len=64"):
        llm.embed([LONG], truncate_prompt_tokens=65)
    assert "truncate_prompt_tokens=5" in repr(PoolingParams(truncate_prompt_tokens=5))
    assert not llm.engine.has_unfinished()


def test_server_routes_truncate(checkpoint):
    from fastapi.testclient import TestClient

    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.serving.app import build_app

    _, folder = checkpoint("bert")
    engine = AsyncEngine(LLM(str(folder), block_size=4, num_blocks=64, attention="torch"))
    with TestClient(build_app(engine, model_name="bert")) as client:
        r = client.post("/v1/embeddings", json={"input": [LONG, LONG[-64:]], "truncate_prompt_tokens": -1})
        assert r.status_code == 200, r.text
        a, b = (x["embedding"] for x in r.json()["data"])
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
        assert r.json()["usage"]["prompt_tokens"] == 128
        assert client.post("/v1/embeddings", json={"input": [LONG]}).status_code == 400
        bad = client.post("/v1/embeddings", json={"input": [LONG], "truncate_prompt_tokens": 0})
        assert bad.status_code == 400 and "truncate_prompt_tokens" in bad.text


def test_text_keeps_the_tokenizers_leading_cls(tmp_path):
    """A text prompt cut to k tokens keeps its [CLS] (the CLS pooler's row) and ends with
    [SEP], as a left-truncating tokenizer (vLLM's) gives it; token-id prompts are cut as given."""
    import transformers as tf

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"x{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(60)]
    tok = tf.BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    tok.save_pretrained(tmp_path)
    torch.manual_seed(0)
    hf = tf.BertModel(tf.BertConfig(vocab_size=len(words), hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=80, max_position_embeddings=64), add_pooling_layer=False).eval()
    hf.save_pretrained(tmp_path)
    text = " ".join(words[5:25])
    with LLM(str(tmp_path), block_size=4, num_blocks=64, attention="torch") as llm:
        got = llm.embed([text], truncate_prompt_tokens=8)[0]
        tok.truncation_side = "left"
        want_ids = tok(text, truncation=True, max_length=8)["input_ids"]
        assert got.prompt_token_ids == want_ids and want_ids[0] == tok.cls_token_id and len(set(want_ids)) == 8
        with torch.no_grad():
            want = torch.nn.functional.normalize(hf(torch.tensor([want_ids])).last_hidden_state[0, 0], dim=0)
        torch.testing.assert_close(torch.tensor(got.outputs.embedding), want, rtol=1e-4, atol=1e-5)
        ids = tok(text)["input_ids"]
        assert llm.embed([ids], truncate_prompt_tokens=8)[0].prompt_token_ids == ids[-8:]
