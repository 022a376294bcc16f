"""Pooling on a decoder (tiny random Qwen3): embeddings against transformers' hidden states
(LAST = the Qwen3-Embedding recipe, MEAN over chunked prefills), the Qwen3-Reranker yes/no
recipe against transformers' logits, mixed batches of pooling and generation, aborts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import LLM, SamplingParams
from toolkit.pooling import PoolerConfig, PoolingParams

PROMPTS = [[5, 9, 33, 2, 7, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
           [3, 4, 5], [7] * 9, [400, 1, 2, 300, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
YES, NO = 17, 42


def hf_hidden(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf.model(torch.tensor([ids])).last_hidden_state[0]           # [P, H]


def engine(folder, **kw) -> LLM:
    # a budget of 8 tokens: the long prompts run in chunks, beside other requests
    return LLM(str(folder), max_num_batched_tokens=8, block_size=4, num_blocks=96, **kw)


def test_last_token_embeddings_match_transformers(checkpoint):
    hf, folder = checkpoint("qwen3")
    llm = engine(folder)
    outs = llm.embed(PROMPTS)
    raw = llm.embed(PROMPTS, PoolingParams(normalize=False))
    small = llm.embed(PROMPTS[:1], PoolingParams(dimensions=10))
    for o, r, p in zip(outs, raw, PROMPTS):
        want = hf_hidden(hf, p)[-1]
        torch.testing.assert_close(torch.tensor(r.outputs.embedding), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(o.outputs.embedding), F.normalize(want, dim=0),
                                   rtol=1e-4, atol=1e-5)
        assert o.prompt_token_ids == p
    raw2 = llm.encode(PROMPTS[:1], PoolingParams(normalize=False))[0]
    torch.testing.assert_close(raw2.outputs.data, torch.tensor(raw[0].outputs.embedding))
    want = F.normalize(hf_hidden(hf, PROMPTS[0])[-1][:10], dim=0)
    torch.testing.assert_close(torch.tensor(small[0].outputs.embedding), want, rtol=1e-4, atol=1e-5)
    assert llm.engine.allocator.num_free_blocks() == llm.engine.allocator.num_blocks
    assert len(llm.engine.runner.pooling) == 0


def test_mean_pooling_over_chunks_matches_transformers(checkpoint):
    hf, folder = checkpoint("qwen3")
    llm = engine(folder, pooler_config=PoolerConfig(pooling_type="MEAN", normalize=False),
                 enable_prefix_caching=True)
    for _ in range(2):                   # the second time the prompts are cached: still every row
        outs = llm.embed(PROMPTS)
        for o, p in zip(outs, PROMPTS):
            torch.testing.assert_close(torch.tensor(o.outputs.embedding), hf_hidden(hf, p).mean(0),
                                       rtol=1e-4, atol=1e-4)


def test_mixed_batches_give_each_request_its_result_alone(checkpoint):
    """Generation and pooling requests in the same steps (chunks share the 8-token budget)
    give what each gives alone: greedy tokens equal, embeddings within a tolerance."""
    _, folder = checkpoint("qwen3")
    llm = engine(folder)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    gen_alone = [o.token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    emb_alone = [o.outputs.embedding for o in llm.embed(PROMPTS)]
    e = llm.engine
    for i, p in enumerate(PROMPTS):
        e.add_request(p, greedy, request_id=f"g{i}")
        e.add_request(p, PoolingParams(task="embed"), request_id=f"e{i}")
    steps, schedule = [], e.scheduler.schedule

    def recording():
        out = schedule()
        steps.append({s.request_id[0] for s in out.scheduled})
        return out

    e.scheduler.schedule = recording
    done = {}
    while e.has_unfinished():
        done.update({o.request_id: o for o in e.step() if o.finished})
    assert sum(kinds == {"g", "e"} for kinds in steps) >= 2      # steps shared by both job classes
    for i in range(len(PROMPTS)):
        assert done[f"g{i}"].token_ids == gen_alone[i]
        torch.testing.assert_close(done[f"e{i}"].outputs.data, torch.tensor(emb_alone[i]), rtol=1e-4, atol=1e-5)
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks


def test_reranker_yes_no_recipe_matches_transformers(checkpoint):
    """Qwen3-Reranker as vLLM serves it: score = softmax over the [no, yes] logits of the last token."""
    hf, folder = checkpoint("qwen3")
    llm = engine(folder, pooler_config={"pooling_type": "LAST", "classifier_from_token": [NO, YES]})
    query, docs = [5, 9, 33], [[2, 7, 100, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [1]]
    scores = llm.score(query, docs)
    probs = llm.classify([query + d for d in docs])
    for s, c, d in zip(scores, probs, docs):
        with torch.no_grad():
            logits = hf(torch.tensor([query + d])).logits[0, -1]
        want = torch.softmax(logits[[NO, YES]], 0)
        assert abs(s.outputs.score - float(want[1])) < 1e-4
        torch.testing.assert_close(torch.tensor(c.outputs.probs), want, rtol=1e-4, atol=1e-5)


def test_abort_mid_prefill_frees_blocks_and_rows(checkpoint):
    _, folder = checkpoint("qwen3")
    llm = engine(folder, pooler_config={"pooling_type": "MEAN"})
    e = llm.engine
    e.add_request(PROMPTS[0], PoolingParams(), request_id="a")
    e.step()                                             # one 8-token chunk of 23
    assert len(e.runner.pooling) == 1
    e.abort("a")
    assert not e.has_unfinished()
    e.add_request(PROMPTS[1], PoolingParams(), request_id="b")
    while e.has_unfinished():
        e.step()
    assert len(e.runner.pooling) == 0
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks


def test_wrong_task_and_bad_input_are_refused(checkpoint):
    _, folder = checkpoint("qwen3")
    llm = engine(folder)
    with pytest.raises(ValueError, match="serves pooling tasks"):
        llm.classify([[1, 2, 3]])
    with pytest.raises(ValueError, match="pooling_params.task"):
        llm.embed([[1, 2]], PoolingParams(task="score"))
    with pytest.raises(ValueError, match="vocabulary"):
        llm.embed([[10**6]])
    with pytest.raises(ValueError, match="max_model_len"):
        llm.embed([[1] * 600])
    assert not llm.engine.has_unfinished()
