"""Statistical exactness of the rejection sampler (the float64 twin, the CPU path).

Each example verifies tens of thousands of independent copies of one situation in a single
batched call (one request per copy, fresh noise keys), then compares the emitted tokens'
empirical distribution with the target's by a chi-square test at ALPHA (spec_stats.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from spec_stats import ALPHA, chi_square_pvalue, draw_from, rand_keys

from toolkit.kernels.reference_spec import race_sample, rejection_sample

N = 20_000


@st.composite
def distributions(draw, v: int, n: int) -> torch.Tensor:
    """n distributions over v tokens (float32 [n, v]), with zeros (even a single support)."""
    rows = []
    for _ in range(n):
        w = draw(st.lists(st.sampled_from([0.0, 0.0, 1e-3, 0.1, 0.5, 1.0, 3.0]), min_size=v, max_size=v))
        if sum(w) == 0:
            w[draw(st.integers(0, v - 1))] = 1.0
        t = torch.tensor(w, dtype=torch.float64)
        rows.append((t / t.sum()).float())
    return torch.stack(rows)


def verify_copies(p_rows: torch.Tensor, drafts: torch.Tensor, q_rows: torch.Tensor | None,
                  gen: torch.Generator, greedy: bool = False):
    """N copies of one request: target rows p_rows [k+1, V] (the same for every copy), drafts
    int64 [N, k] (per copy), draft distribution rows q_rows [k, V] or None (one-hot)."""
    n, k = drafts.shape
    probs = p_rows.repeat(n, 1)                                       # [N*(k+1), V]
    dprobs = q_rows.repeat(n, 1) if q_rows is not None else None      # [N*k, V]
    return rejection_sample(probs, drafts.reshape(-1), dprobs, torch.full((n,), k, dtype=torch.int32),
                            rand_keys(n * (k + 1), gen), torch.full((n,), greedy), k)


@given(v=st.integers(2, 12), k=st.integers(1, 4), with_probs=st.booleans(), data=st.data(),
       seed=st.integers(0, 2 ** 31))
def test_first_token_has_the_target_distribution(v, k, with_probs, data, seed):
    p = data.draw(distributions(v, k + 1), label="p")
    q = data.draw(distributions(v, k), label="q")                     # may put mass where p has none
    gen = torch.Generator().manual_seed(seed)
    if with_probs:
        drafts = torch.stack([draw_from(q[j], N, gen) for j in range(k)], dim=1)    # [N, k]
    else:   # deterministic drafts: any token, including ones the target never emits
        drafts = torch.randint(0, v, (N, k), generator=gen)
    tokens, counts = verify_copies(p, drafts, q if with_probs else None, gen)
    assert bool(((counts >= 1) & (counts <= k + 1)).all())
    first = torch.bincount(tokens[:, 0], minlength=v)
    assert chi_square_pvalue(first, p[0]) > ALPHA


@given(data=st.data(), with_probs=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_emitted_sequence_has_the_target_distribution(data, with_probs, seed):
    """k = 2 over V = 3, with context-dependent target and draft: the first three tokens of the
    output (finishing with plain sampling from p when a step emits fewer) ~ p(t1) p(t2|t1) p(t3|t1 t2)."""
    v, k, n = 3, 2, 60_000
    p0 = data.draw(distributions(v, 1))[0]
    p1 = data.draw(distributions(v, v))                               # [V, V]: p(t2 | t1)
    p2 = data.draw(distributions(v, v * v)).reshape(v, v, v)          # p(t3 | t1, t2)
    q0 = data.draw(distributions(v, 1))[0]
    q1 = data.draw(distributions(v, v))
    gen = torch.Generator().manual_seed(seed)
    if with_probs:
        x0 = draw_from(q0, n, gen)
        x1 = torch.multinomial(q1[x0].double(), 1, generator=gen)[:, 0]
        dprobs = torch.stack([q0.expand(n, v), q1[x0]], dim=1).reshape(n * k, v)
    else:
        x0, x1 = torch.randint(0, v, (n,), generator=gen), torch.randint(0, v, (n,), generator=gen)
        dprobs = None
    # target rows of each copy: after its own drafts
    probs = torch.stack([p0.expand(n, v), p1[x0], p2[x0, x1]], dim=1).reshape(n * 3, v)
    tokens, counts = rejection_sample(probs, torch.stack([x0, x1], 1).reshape(-1), dprobs,
                                      torch.full((n,), k, dtype=torch.int32), rand_keys(n * 3, gen),
                                      torch.zeros(n, dtype=torch.bool), k)
    t1 = tokens[:, 0]
    t2 = torch.where(counts >= 2, tokens[:, 1],
                     torch.multinomial(p1[t1].double(), 1, generator=gen)[:, 0])
    t3 = torch.where(counts >= 3, tokens[:, 2],
                     torch.multinomial(p2[t1, t2].double(), 1, generator=gen)[:, 0])
    joint = torch.bincount(t1 * 9 + t2 * 3 + t3, minlength=27)
    expected = (p0[:, None, None] * p1[:, :, None] * p2).reshape(-1)
    assert chi_square_pvalue(joint, expected) > ALPHA


@given(v=st.integers(2, 12), k=st.integers(1, 4), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_draft_equal_to_target_is_always_accepted(v, k, data, seed):
    p = data.draw(distributions(v, k + 1))
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack([draw_from(p[j], 2000, gen) for j in range(k)], dim=1)
    tokens, counts = verify_copies(p, drafts, p[:k].clone(), gen)
    assert bool((counts == k + 1).all())
    assert torch.equal(tokens[:, :k], drafts)
    assert chi_square_pvalue(torch.bincount(tokens[:, k], minlength=v), p[k]) > ALPHA


def test_zero_target_mass_is_never_emitted():
    """A draft that puts most of its mass where the target has none: never emitted, and the
    first token still follows p."""
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.9, 0.05, 0.05, 0.0]])
    gen = torch.Generator().manual_seed(1)
    drafts = draw_from(q[0], N, gen)[:, None]
    tokens, _counts = verify_copies(p, drafts, q, gen)
    first = torch.bincount(tokens[:, 0], minlength=4)
    assert first[0] == 0 and first[2] == 0
    assert chi_square_pvalue(first, p[0]) > ALPHA


def _wrong_resample_from_p(p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, gen: torch.Generator):
    """A classic bug: after a rejection, sample from p instead of normalize(max(p - q, 0))."""
    n = x.shape[0]
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    accept = u * q[x].double() < p[x].double()
    fresh = race_sample(p.double().expand(n, -1), rand_keys(n, gen))
    return torch.where(accept, x, fresh)


def test_the_chi_square_check_catches_a_wrong_sampler():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    gen = torch.Generator().manual_seed(2)
    x = draw_from(q, N, gen)
    wrong = torch.bincount(_wrong_resample_from_p(p, x, q, gen), minlength=4)
    assert chi_square_pvalue(wrong, p) < ALPHA
    tokens, _ = verify_copies(torch.stack([p, p]), x[:, None], q[None], gen)
    assert chi_square_pvalue(torch.bincount(tokens[:, 0], minlength=4), p) > ALPHA


@pytest.mark.parametrize("with_probs", [False, True])
def test_greedy_follows_the_argmax_chain(with_probs):
    """Greedy: accept while draft == argmax (ties -> lowest id), then emit the argmax."""
    gen = torch.Generator().manual_seed(3)
    v, b, k = 5, 400, 3
    logits = torch.randint(0, 3, (b * (k + 1), v), generator=gen).float()   # many ties
    probs = torch.softmax(logits, -1)
    drafts = torch.randint(0, v, (b, k), generator=gen)
    amax = torch.argmax(probs, -1).reshape(b, k + 1)
    drafts = torch.where(torch.rand(b, k, generator=gen) < 0.7, amax[:, :k], drafts)  # long prefixes
    ks = torch.randint(0, k + 1, (b,), generator=gen, dtype=torch.int32)
    flat_p = torch.cat([probs.reshape(b, k + 1, v)[i, :ks[i] + 1] for i in range(b)])
    flat_d = torch.cat([drafts[i, :ks[i]] for i in range(b)])
    dprobs = torch.softmax(torch.randn(flat_d.shape[0], v, generator=gen), -1) if with_probs else None
    tokens, counts = rejection_sample(flat_p, flat_d, dprobs, ks, rand_keys(flat_p.shape[0], gen),
                                      torch.ones(b, dtype=torch.bool), k)
    for i in range(b):
        want = []
        for j in range(int(ks[i]) + 1):
            best = int(amax[i, j])
            want.append(best)
            if j == ks[i] or int(drafts[i, j]) != best:
                break
        assert tokens[i, :counts[i]].tolist() == want
        assert bool((tokens[i, counts[i]:] == -1).all())
