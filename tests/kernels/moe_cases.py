"""Hypothesis strategies of mixture-of-experts inputs: ragged expert loads (experts with no
token, all tokens on one expert, one token), top-k from 1 to E, tied router logits."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


@st.composite
def routed(draw, max_t: int = 9, max_e: int = 6, max_d: int = 13, max_i: int = 11):
    """(x [T, D], w13 [E, 2I, D], w2 [E, D, I], topk_weights float32 [T, k], topk_ids int64 [T, k]):
    each row's ids distinct; the loads skewed by a drawn mode."""
    t, e = draw(st.integers(1, max_t)), draw(st.integers(1, max_e))
    d, i, k = draw(st.integers(1, max_d)), draw(st.integers(1, max_i)), draw(st.integers(1, e))
    seed = draw(st.integers(0, 2**16))
    mode = draw(st.sampled_from(["random", "crowded", "sparse"]))
    g = torch.Generator().manual_seed(seed)
    if mode == "crowded":        # every token picks the same first k experts: the others get none
        ids = torch.arange(k).repeat(t, 1)
    elif mode == "sparse":       # only experts [E - k, E): the low ones get no token
        ids = torch.stack([torch.randperm(k, generator=g) + (e - k) for _ in range(t)])
    else:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    x = torch.randn(t, d, generator=g)
    w13 = torch.randn(e, 2 * i, d, generator=g) / d ** 0.5
    w2 = torch.randn(e, d, i, generator=g) / i ** 0.5
    weights = torch.rand(t, k, generator=g)
    return x, w13, w2, weights, ids.to(torch.int64)


@st.composite
def router_logits(draw, max_t: int = 7, max_e: int = 8):
    """(logits [T, E], top_k): values from a small set so ties are common."""
    t, e = draw(st.integers(1, max_t)), draw(st.integers(1, max_e))
    k = draw(st.integers(1, e))
    vals = draw(st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.0, 1.0, 3.0]), min_size=t * e, max_size=t * e))
    return torch.tensor(vals).view(t, e), k
