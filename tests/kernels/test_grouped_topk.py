"""Grouped top-k routing (DeepSeek-V2/V3, dots.llm1): the batched, sync-free op in
`toolkit/kernels/moe_torch.py` against its token-by-token twin in `reference_moe.py` on tied
logits, -inf logits, groups of one expert, top-k = 1 and = every reachable expert, softmax and
sigmoid scoring with and without the selection-only bias; on the GPU inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import moe_torch, reference_moe

TIED = [-2.0, -0.5, 0.0, 0.0, 1.0, 3.0]       # a small set: ties within and across groups are common


@st.composite
def grouped_case(draw):
    """(logits [T, E], top_k, renormalize, options): E = groups x size, top_k in [1, reach]."""
    t, g, size = draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    e = g * size
    topk_group = draw(st.integers(1, g))
    top_k = draw(st.integers(1, topk_group * size))
    scoring = draw(st.sampled_from(["softmax", "sigmoid"]))
    vals = draw(st.lists(st.sampled_from(TIED + [float("-inf")]), min_size=t * e, max_size=t * e))
    logits = torch.tensor(vals).view(t, e)
    if scoring == "softmax":          # a row of only -inf has no softmax: keep one finite logit a row
        logits[:, 0] = torch.where(torch.isinf(logits[:, 0]), 0.0, logits[:, 0])
    bias = None
    if draw(st.booleans()):
        bias = torch.tensor(draw(st.lists(st.sampled_from([-0.5, 0.0, 0.0, 0.25, 1.0]), min_size=e, max_size=e)))
    opts = dict(num_expert_group=g, topk_group=topk_group, scoring_func=scoring, e_score_correction_bias=bias,
                routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])))
    return logits, top_k, draw(st.booleans()), opts


@given(grouped_case())
def test_grouped_topk_equals_the_twin(case):
    """The same experts in the same order (ties to the lower id) and the same weights."""
    logits, k, renormalize, opts = case
    w, ids = moe_torch.grouped_topk(logits, k, renormalize, **opts)
    w_ref, ids_ref = reference_moe.grouped_topk(logits, k, renormalize, **opts)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (logits.shape[0], k)
    assert torch.isfinite(w).all() and torch.isfinite(w_ref).all()
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
    for row in ids.tolist():
        assert len(set(row)) == k                                            # k distinct experts
    size = logits.shape[1] // opts["num_expert_group"]
    for row in (ids // size).tolist():
        assert len(set(row)) <= opts["topk_group"]                           # from the kept groups only


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("g,size,topk_group,k", [
    (6, 1, 3, 1),      # groups of one expert, top-1
    (6, 1, 6, 6),      # groups of one, every group kept, top-k = E
    (3, 2, 3, 6),      # top-k = E
    (2, 3, 1, 3),      # top-k = every expert of the one kept group
    (1, 6, 1, 1),      # one group: plain top-1
])
def test_the_edges_equal_the_twin(g, size, topk_group, k, scoring):
    """Always run (hypothesis may not draw them): groups of one, top-k = 1 and = E, a kept
    group exhausted; tied and -inf logits, with and without a tied bias."""
    e = g * size
    logits = torch.tensor([[0.0] * e, [1.0, float("-inf")] * (e // 2) + [1.0] * (e % 2),
                           [3.0 - (x % 3) for x in range(e)]])
    for bias in (None, torch.tensor([0.5 * (x % 2) for x in range(e)])):
        opts = dict(num_expert_group=g, topk_group=topk_group, scoring_func=scoring, e_score_correction_bias=bias,
                    routed_scaling_factor=1.5)
        w, ids = moe_torch.grouped_topk(logits, k, True, **opts)
        w_ref, ids_ref = reference_moe.grouped_topk(logits, k, True, **opts)
        assert torch.equal(ids, ids_ref) and torch.isfinite(w).all()
        torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
        if k == e:
            assert sorted(ids[0].tolist()) == list(range(e))


@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_one_group_without_bias_is_plain_softmax_top_k(t, e, data):
    """n_group = topk_group = 1, softmax, no bias: the ungrouped router's weights."""
    k = data.draw(st.integers(1, e))
    logits = torch.tensor(data.draw(st.lists(st.sampled_from(TIED), min_size=t * e, max_size=t * e))).view(t, e)
    for renormalize in (False, True):
        w, _ = moe_torch.grouped_topk(logits, k, renormalize, num_expert_group=1, topk_group=1)
        w_plain, _ = moe_torch.select_experts(logits, k, renormalize)
        torch.testing.assert_close(w, w_plain, rtol=1e-6, atol=1e-7)


def test_the_bias_picks_experts_but_does_not_weigh_them():
    """A large bias on expert 3 makes it chosen; its weight is still its sigmoid score, scaled."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -3.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])
    w, ids = moe_torch.grouped_topk(logits, 2, False, num_expert_group=2, topk_group=2, scoring_func="sigmoid",
                                    e_score_correction_bias=bias, routed_scaling_factor=2.0)
    assert ids.tolist() == [[3, 0]]
    torch.testing.assert_close(w, 2.0 * torch.sigmoid(torch.tensor([[-3.0, 2.0]])))


def test_groups_restrict_the_choice():
    """Group scores (sum of the best two with a bias, the best one without) keep one group; the
    top experts overall may lie outside it."""
    logits = torch.tensor([[5.0, -5.0, 3.0, 3.0]])    # groups {0, 1} and {2, 3}
    _, ids = moe_torch.grouped_topk(logits, 1, False, num_expert_group=2, topk_group=1)
    assert ids.tolist() == [[0]]                      # best single score: group 0
    _, ids = moe_torch.grouped_topk(logits, 2, False, num_expert_group=2, topk_group=1, scoring_func="sigmoid",
                                    e_score_correction_bias=torch.zeros(4))
    assert ids.tolist() == [[2, 3]]                   # best pair: group 1


def test_bad_grouped_options_name_what_is_valid():
    x = torch.zeros(2, 6)
    with pytest.raises(ValueError, match="n_group 4 must be >= 1 and divide the 6 experts"):
        moe_torch.grouped_topk(x, 1, True, num_expert_group=4, topk_group=1)
    with pytest.raises(ValueError, match=r"topk_group must be in \[1, 3\]"):
        moe_torch.grouped_topk(x, 1, True, num_expert_group=3, topk_group=4)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 2\] \(topk_group x experts per group\)"):
        moe_torch.grouped_topk(x, 3, True, num_expert_group=3, topk_group=1)
    with pytest.raises(ValueError, match="scoring_func must be 'softmax' or 'sigmoid'"):
        reference_moe.grouped_topk(x, 1, True, num_expert_group=1, topk_group=1, scoring_func="tanh")
    with pytest.raises(ValueError, match=r"e_score_correction_bias must be \[E\] = \[6\]"):
        moe_torch.grouped_topk(x, 1, True, num_expert_group=1, topk_group=1, e_score_correction_bias=torch.zeros(5))


@pytest.mark.gpu
def test_grouped_topk_replays_in_a_cuda_graph():
    """DeepSeek-V3's shape (256 experts, 8 groups, top-4 groups, top-8, sigmoid, bias): captured
    once, replayed on new logits, equal to the twin; no host sync in capture."""
    e, k = 256, 8
    bias = torch.randn(e, device="cuda") * 0.1
    opts = dict(num_expert_group=8, topk_group=4, scoring_func="sigmoid", e_score_correction_bias=bias,
                routed_scaling_factor=2.5)
    logits = torch.randn(64, e, device="cuda")
    moe_torch.grouped_topk(logits, k, True, **opts)                          # warm up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, ids = moe_torch.grouped_topk(logits, k, True, **opts)
    logits.copy_(torch.randn(64, e, device="cuda"))
    graph.replay()
    w_ref, ids_ref = reference_moe.grouped_topk(logits.cpu(), k, True, **{**opts, "e_score_correction_bias": bias.cpu()})
    assert torch.equal(ids.cpu(), ids_ref)
    torch.testing.assert_close(w.cpu(), w_ref, rtol=1e-5, atol=1e-6)
