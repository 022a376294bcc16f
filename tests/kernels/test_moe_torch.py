"""The mixture-of-experts torch paths against their twins (toolkit/kernels/reference_moe.py):
the router's top-k (ties included) and the sorted CPU experts path against the per-expert loop,
on ragged loads; and the twin itself against a dense all-experts formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from moe_cases import routed, router_logits

from toolkit.kernels import moe_torch, reference_moe


def _dense(x, w13, w2, weights, ids):
    """Every expert on every token, weighted by a dense [T, E] gate matrix (zeros off the top-k)."""
    i = w13.shape[1] // 2
    gates = torch.zeros(x.shape[0], w13.shape[0]).scatter_(1, ids, weights)           # [T, E]
    h = torch.einsum("td,end->ten", x, w13)                                            # [T, E, 2I]
    y = torch.einsum("tei,edi->ted", F.silu(h[..., :i]) * h[..., i:], w2)              # [T, E, D]
    return (y * gates[..., None]).sum(1)


@given(routed())
def test_the_twin_equals_the_dense_formula(case):
    torch.testing.assert_close(reference_moe.fused_experts(*case), _dense(*case), rtol=1e-5, atol=1e-5)


@given(routed(), st.sampled_from([torch.float32, torch.float16]))
def test_the_sorted_torch_path_equals_the_twin(case, dtype):
    x, w13, w2, weights, ids = case
    args = (x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids)
    got = moe_torch.fused_experts(*args)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), reference_moe.fused_experts(*args).float(), rtol=tol, atol=tol)


@given(router_logits(), st.booleans())
def test_the_router_selects_a_top_k_as_the_twin(case, renormalize):
    """The same weights (highest first); under ties the ids may differ, but each chosen expert's
    probability is at least every unchosen one's."""
    logits, k = case
    w, ids = moe_torch.select_experts(logits, k, renormalize)
    w_ref, _ = reference_moe.select_experts(logits, k, renormalize)
    assert w.dtype == torch.float32 and ids.shape == (logits.shape[0], k)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-6)
    p = torch.softmax(logits, -1)
    for row in range(logits.shape[0]):
        chosen = set(ids[row].tolist())
        assert len(chosen) == k
        rest = [p[row, e] for e in range(logits.shape[1]) if e not in chosen]
        assert not rest or min(p[row, e] for e in chosen) >= max(rest)
        if renormalize:
            assert w[row].sum() == pytest.approx(1.0, abs=1e-6)


def test_router_and_experts_refuse_bad_shapes():
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 4\]"):
        moe_torch.select_experts(torch.zeros(2, 4), 5, True)
    with pytest.raises(ValueError, match=r"w13 .* must be \[E, 2I, D\]"):
        moe_torch.fused_experts(torch.zeros(2, 3), torch.zeros(4, 6, 5), torch.zeros(4, 3, 3),
                                torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.int64))
