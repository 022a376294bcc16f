"""The Triton rejection kernel against its float64 twin (interpreter on the CPU: small V, fp32).

The property test draws ragged draft counts, odd vocabulary sizes, several vocabulary blocks,
padded row strides, greedy and random requests, and four kinds of draft distributions:

  one-hot   no draft probabilities (q = e_x); the drafts are mostly the target's peak token
  given     a random softmax per draft row
  peaked    q peaks on the same token as p with more mass, and the draft is that token, so
            max(p - q, 0) is zero exactly where p is largest: a recovered token drawn from p
            instead of the residual picks that token most of the time
  dominant  q = c * p with c > 1: rejections happen and the residual has no mass (the p fallback)

Besides bit-equality with the twin, a twin-free invariant is checked: the token emitted at a
rejected position has residual mass (p > q there), or, where the residual is empty, mass under p.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import reference_spec as ref
from toolkit.kernels.rejection_sample import rejection_sample

Q_KINDS = ("peaked", "one-hot", "given", "dominant")


def _case(ks: list[int], v: int, with_probs: bool, greedy: list[bool], seed: int,
          device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    r, d = sum(ks) + len(ks), sum(ks)
    logits = torch.randn(r, v, generator=gen) * 3
    logits[torch.rand(r, v, generator=gen) < 0.3] = float("-inf")     # zero-mass tokens
    logits[:, 0] = torch.where(torch.isinf(logits).all(1), 0.0, logits[:, 0])
    probs = torch.softmax(logits, -1)
    amax = torch.argmax(probs, -1)
    ids = torch.randint(0, v, (d,), generator=gen)
    # half of the drafts copy the argmax, so long accepted prefixes happen
    rows = _draft_rows(ks)
    ids = torch.where(torch.rand(d, generator=gen) < 0.5, amax[rows], ids)
    dprobs = torch.softmax(torch.randn(d, v, generator=gen) * 2, -1) if with_probs else None
    keys = torch.randint(0, 2 ** 62, (r,), generator=gen)
    args = [probs, ids, dprobs, torch.tensor(ks, dtype=torch.int32), keys,
            torch.tensor(greedy), max(ks, default=0)]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _draft_rows(ks: list[int]) -> torch.Tensor:
    """int64 [D]: the target row each draft position is verified against."""
    starts = ref.spec_row_starts(torch.tensor(ks, dtype=torch.int32)).tolist()
    rows = [torch.arange(s, s + k) for s, k in zip(starts, ks)]
    return torch.cat(rows) if sum(ks) else torch.zeros(0, dtype=torch.int64)


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """The same values with row stride V + pad (the kernels take a row stride)."""
    if pad == 0 or t.shape[0] == 0:
        return t
    wide = torch.full((t.shape[0], t.shape[1] + pad), float("nan"), dtype=t.dtype)
    wide[:, :t.shape[1]] = t
    return wide[:, :t.shape[1]]


def _peaked_case(ks, v, q_kind, greedy, seed, peak, pad):
    """Target rows with one token of mass `peak` over a random softmax (with zero-mass tokens)."""
    gen = torch.Generator().manual_seed(seed)
    r, d = sum(ks) + len(ks), sum(ks)
    logits = torch.randn(r, v, generator=gen, dtype=torch.float64) * 3
    logits[torch.rand(r, v, generator=gen) < 0.3] = float("-inf")
    top = torch.randint(0, v, (r,), generator=gen)
    at_top = (torch.arange(r), top)
    logits[at_top] = torch.where(torch.isinf(logits).all(1), 0.0, logits[at_top])  # mass somewhere
    base = torch.softmax(logits, -1)
    p = (1 - peak) * base
    p[torch.arange(r), top] += peak
    rows = _draft_rows(ks)
    rand_ids = torch.randint(0, v, (d,), generator=gen)
    ids = torch.where(torch.rand(d, generator=gen) < 0.75, top[rows], rand_ids)
    if q_kind == "one-hot":
        q = None
    elif q_kind == "given":
        q = torch.softmax(torch.randn(d, v, generator=gen, dtype=torch.float64) * 2, -1)
    elif q_kind == "peaked":                   # q puts more mass than p on p's peak
        u = torch.rand(d, 1, generator=gen, dtype=torch.float64)
        qpeak = peak + (1 - peak) * (0.5 + 0.5 * u)
        q = (1 - qpeak) * torch.softmax(torch.randn(d, v, generator=gen, dtype=torch.float64), -1)
        q[torch.arange(d), top[rows]] += qpeak[:, 0]
        ids = top[rows]
    else:                                      # dominant: p <= q everywhere, the residual is empty
        q = p[rows] * (1.25 + torch.rand(d, 1, generator=gen, dtype=torch.float64))
    keys = torch.randint(0, 2 ** 62, (r,), generator=gen)
    p32 = _padded(p.to(torch.float32), pad)
    q32 = None if q is None else _padded(q.to(torch.float32), pad)
    return [p32, ids, q32, torch.tensor(ks, dtype=torch.int32), keys, torch.tensor(greedy)]


def _check_recovered_in_residual(args, tokens, counts):
    """Twin-free: a token emitted at a rejected position lies in the support of max(p - q, 0)
    (or of p where that residual is empty)."""
    p, ids, q, ks, _, greedy = args[:6]
    starts = ref.spec_row_starts(ks).tolist()
    for b, (k, s) in enumerate(zip(ks.tolist(), starts)):
        n_acc = int(counts[b]) - 1
        if greedy[b] or n_acc >= k:
            continue
        t, pr = int(tokens[b, n_acc]), p[s + n_acc].to(torch.float64)
        d = s - b + n_acc
        if q is not None:
            qr = q[d].to(torch.float64)
        else:
            qr = torch.nn.functional.one_hot(ids[d], p.shape[1]).double()
        resid = torch.clamp(pr - qr, min=0.0)
        if resid.sum() > 0:
            assert resid[t] > 0, f"request {b}: recovered token {t} has no residual mass"
        else:
            assert pr[t] > 0, f"request {b}: fallback token {t} has no mass under p"


@st.composite
def spec_cases(draw):
    # hypothesis leans towards the first choice of sampled_from and short lists, so the first
    # choices are the ones that tell a residual from p apart (peaked q, several drafts, V = 37)
    ks = draw(st.lists(st.sampled_from([3, 5, 1, 0, 2, 4]), min_size=3, max_size=8))
    greedy = draw(st.lists(st.sampled_from([False, False, False, True]),
                           min_size=len(ks), max_size=len(ks)))
    return {
        "ks": ks, "greedy": greedy,
        "v": draw(st.sampled_from([37, 5, 100, 2, 3, 17, 64])),
        "q_kind": draw(st.sampled_from(Q_KINDS)),
        "seed": draw(st.integers(0, 2 ** 31 - 1)),
        "peak": draw(st.sampled_from([0.5, 0.7, 0.3, 0.9, 0.0])),
        "pad": draw(st.sampled_from([0, 3])),
        "extra_cols": draw(st.integers(0, 2)),
        "block": draw(st.sampled_from([16, 32, 1024])),
    }


@settings(max_examples=60)
@given(case=spec_cases())
def test_kernel_equals_twin(case):
    args = _peaked_case(case["ks"], case["v"], case["q_kind"], case["greedy"], case["seed"],
                        case["peak"], case["pad"])
    args.append(max(case["ks"]) + case["extra_cols"])
    want_t, want_n = ref.rejection_sample(*args)
    got_t, got_n = rejection_sample(*args, block=case["block"])
    assert torch.equal(got_n, want_n)
    assert torch.equal(got_t, want_t)
    _check_recovered_in_residual(args, got_t, got_n)


def test_recovered_token_comes_from_the_residual():
    """Every request drafts p's peak token with q more peaked there; over 32 keys some are rejected,
    and none of those may emit the peak (it has no residual mass), though p would pick it often."""
    ks = [1] * 32
    args = _peaked_case(ks, 37, "peaked", [False] * 32, 3, 0.8, 0)
    args.append(1)
    tokens, counts = rejection_sample(*args, block=16)
    rejected = counts == 1
    assert 3 <= int(rejected.sum()) <= 29
    assert not torch.any(tokens[rejected, 0] == args[1][rejected])    # the draft was p's peak
    # the case has teeth: the same noise raced over p (not the residual) picks the peak mostly
    rows = torch.arange(0, 64, 2)[rejected]
    from_p = ref.race_sample(args[0][rows].double(), args[4][rows])
    assert (from_p == args[1][rejected]).float().mean() > 0.5
    _check_recovered_in_residual(args, tokens, counts)


def test_kernel_takes_the_given_argmax_and_wider_output():
    args = _case([2, 0, 3], 11, False, [True, True, False], 5)
    args[6] = 6                                                        # more padding columns
    amax = torch.randint(0, 11, (args[0].shape[0],), generator=torch.Generator().manual_seed(0))
    want = ref.rejection_sample(*args, target_argmax=amax)
    got = rejection_sample(*args, target_argmax=amax)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[0].shape == (3, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("with_probs", [False, True])
def test_kernel_equals_twin_at_real_vocabulary(with_probs):
    ks = [0, 1, 4, 8, 3] * 13
    args = _case(ks, 151_936, with_probs, [i % 3 == 0 for i in range(len(ks))], 7, "cuda")
    want_t, want_n = ref.rejection_sample(*args)
    got_t, got_n = rejection_sample(*args)
    assert torch.equal(got_n, want_n) and torch.equal(got_t, want_t)
