"""BERT encoders on the layers library against transformers (tiny random checkpoints):
bidirectional attention, CLS and MEAN pooling, the cross-encoder's text-pair token types."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import LLM, PoolingParams, SamplingParams

CLS, SEP = 1, 2
TEXTS = [[CLS, 5, 9, 33, 7, 100, 3, 4, 5, 6, SEP], [CLS, 3, SEP], [CLS] + [7] * 12 + [SEP], [CLS, SEP]]


def hf_states(hf, ids, types=None):
    with torch.no_grad():
        kw = {} if types is None else {"token_type_ids": torch.tensor([types])}
        return hf(torch.tensor([ids]), **kw)


def test_bert_embeddings_match_transformers(checkpoint):
    hf, folder = checkpoint("bert")
    llm = LLM(str(folder), max_num_batched_tokens=16, block_size=4, num_blocks=64)
    assert llm.engine.pooling.pooler.config.pooling_type == "CLS"
    cls = llm.embed(TEXTS)
    mean = LLM(str(folder), block_size=4, num_blocks=64, attention="torch",
               pooler_config={"pooling_type": "MEAN", "normalize": False}).embed(TEXTS)
    for c, m, ids in zip(cls, mean, TEXTS):
        h = hf_states(hf, ids).last_hidden_state[0]                         # [P, H]
        torch.testing.assert_close(torch.tensor(c.outputs.embedding), F.normalize(h[0], dim=0),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(m.outputs.embedding), h.mean(0), rtol=1e-4, atol=1e-4)
    assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks


def test_cross_encoder_scores_text_pairs(checkpoint):
    hf, folder = checkpoint("bert_cls")
    llm = LLM(str(folder), block_size=4, num_blocks=64)
    llm.engine.model.sep_token_id = SEP                    # (no tokenizer in the folder to read it from)
    query, docs = [CLS, 5, 9, SEP], [[33, 7, SEP], [100, 3, 4, 5, 6, SEP], [8, SEP]]
    scores = llm.score(query, docs)
    for s, d in zip(scores, docs):
        types = [0] * len(query) + [1] * len(d)
        logit = hf_states(hf, query + d, types).logits[0, 0]
        assert abs(s.outputs.score - float(torch.sigmoid(logit))) < 1e-5
    single = llm.classify([TEXTS[0]])[0].outputs.probs
    assert abs(single[0] - float(torch.sigmoid(hf_states(hf, TEXTS[0]).logits[0, 0]))) < 1e-5


def test_encoder_refuses_generation_and_long_prompts(checkpoint):
    _, folder = checkpoint("bert")
    llm = LLM(str(folder), max_num_batched_tokens=8, block_size=4, num_blocks=64)
    with pytest.raises(ValueError, match="cannot generate"):
        llm.generate([[CLS, 4, SEP]], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="one step"):
        llm.embed([[CLS] + [4] * 10 + [SEP]])
    with pytest.raises(ValueError, match="serves pooling tasks"):
        llm.classify([[CLS, 4, SEP]])
    hidden = llm.engine.model.spec.hidden_size
    with pytest.raises(ValueError, match=f"dimensions={hidden + 1} is more than this model's embedding size"):
        llm.embed([[CLS, 4, SEP]], PoolingParams(dimensions=hidden + 1))
    assert not llm.engine.has_unfinished()
    # a bi-encoder scores a pair by the cosine of the two embeddings (vLLM's rule)
    a, b = [CLS, 4, 9, SEP], [CLS, 5, SEP]
    ea, eb = (torch.tensor(o.outputs.embedding) for o in llm.embed([a, b]))
    assert abs(llm.score(a, b)[0].outputs.score - float(F.cosine_similarity(ea, eb, dim=0))) < 1e-5


def test_a_sentence_transformers_dense_module_is_refused(tmp_path):
    import json

    from toolkit.pooling.config import sentence_transformers_config

    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    (tmp_path / "modules.json").write_text(json.dumps(mods))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    with pytest.raises(ValueError, match=r"modules \['Dense'\] are not supported"):
        sentence_transformers_config(tmp_path)


def test_encoder_prompts_are_never_chunked(checkpoint):
    """Bidirectional prompts wait for a step with room for all of them: the same embeddings
    under an 8-token budget as with a large one."""
    _, folder = checkpoint("bert")
    wide = LLM(str(folder), block_size=4, num_blocks=64).embed(TEXTS[:2] + [TEXTS[1]] * 3)
    tight = LLM(str(folder), max_num_batched_tokens=11, block_size=4, num_blocks=64)
    got = tight.embed(TEXTS[:2] + [TEXTS[1]] * 3)
    for a, b in zip(wide, got):
        torch.testing.assert_close(torch.tensor(a.outputs.embedding), torch.tensor(b.outputs.embedding),
                                   rtol=1e-5, atol=1e-6)


def test_encoder_warm_up_pools_and_leaves_nothing(checkpoint):
    """An encoder has no LM head: its warm-up (inside LLM(...) on CUDA; called directly here)
    runs pooled prompts, never the sampler, and leaves the same embeddings and every block free."""
    from toolkit.worker.warmup import warm_up

    _, folder = checkpoint("bert")
    llm = LLM(str(folder), block_size=4, num_blocks=64)
    before = [e.outputs.embedding for e in llm.embed(TEXTS)]
    took = warm_up(llm.engine.runner, max_num_batched_tokens=64, block_size=4, num_blocks=64,
                   show_progress=False)
    assert took["warmup_s"] > 0
    assert len(llm.engine.runner.pooling) == 0                     # every dummy prompt finished
    after = [e.outputs.embedding for e in llm.embed(TEXTS)]
    for b, a in zip(before, after):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks
