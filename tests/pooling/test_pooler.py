"""The fast Pooler against its reference twin on hypothesis-generated ragged batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.pooling import PoolerConfig, PoolingParams
from toolkit.pooling.pooler import Pooler, pool
from toolkit.pooling.reference import ReferencePooler
from toolkit.pooling.reference import pool as pool_ref


@st.composite
def ragged(draw):
    lens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    h = draw(st.sampled_from([1, 5, 16]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(sum(lens), h, generator=g) * draw(st.sampled_from([1e-3, 1.0, 50.0]))
    if draw(st.booleans()):
        hidden[0] = 0.0                         # a zero vector: normalisation's eps floor
    return hidden, torch.tensor(lens)


@given(ragged(), st.sampled_from(["LAST", "MEAN", "CLS"]))
def test_pool_matches_twin(case, kind):
    hidden, lens = case
    got, want = pool(hidden, lens, kind), pool_ref(hidden, lens, kind)
    assert got.shape == (len(lens), hidden.shape[1]) and got.dtype == torch.float32
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


params_st = st.builds(
    PoolingParams, task=st.sampled_from([None, "embed", "classify", "score"]),
    normalize=st.sampled_from([None, True, False]), use_activation=st.sampled_from([None, False]),
)


@given(ragged(), st.sampled_from(["LAST", "MEAN", "CLS"]), st.booleans(), st.data())
def test_pooler_matches_twin(case, kind, normalize, data):
    hidden, lens = case
    h = hidden.shape[1]
    params = [data.draw(params_st) for _ in range(len(lens))]
    params = [PoolingParams(task=p.task, normalize=p.normalize, use_activation=p.use_activation,
                            dimensions=data.draw(st.sampled_from([None, 1, h]))
                            if p.task in (None, "embed") else None) for p in params]
    classes = data.draw(st.sampled_from([1, 2, 3]))
    w = torch.randn(classes, h, generator=torch.Generator().manual_seed(1))
    head = lambda x: x @ w.T
    cfg = PoolerConfig(pooling_type=kind, normalize=normalize)
    got = Pooler(cfg, head)(hidden, lens, params)
    want = ReferencePooler(cfg, head)(hidden, lens, params)
    for p, g, r in zip(params, got, want):
        assert g.shape == r.shape and not g.isnan().any(), (p, g, r)
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        if (p.task or "embed") == "embed" and (p.normalize if p.normalize is not None else normalize) \
                and g.abs().sum() > 0:
            assert abs(float(g.norm()) - 1) < 1e-4


def test_mean_ignores_other_requests():
    """Each request's mean covers its own rows only: changing a neighbour changes nothing."""
    hidden, lens = torch.randn(7, 4), torch.tensor([3, 4])
    a = pool(hidden, lens, "MEAN")
    hidden[3:] += 100.0
    b = pool(hidden, lens, "MEAN")
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[0], hidden[:3].mean(0))


def test_params_validation():
    with pytest.raises(ValueError, match="task must be one of"):
        PoolingParams(task="generate")
    with pytest.raises(ValueError, match="dimensions"):
        PoolingParams(dimensions=0)
    with pytest.raises(TypeError, match="normalize"):
        PoolingParams(normalize=1)
    with pytest.raises(ValueError, match="pooling_type"):
        PoolerConfig(pooling_type="max")
    assert repr(PoolingParams(task="embed", dimensions=8)) == "PoolingParams(task='embed', dimensions=8)"


def test_no_classifier_refuses_heads():
    with pytest.raises(ValueError, match="embed' only"):
        Pooler(PoolerConfig())(torch.randn(2, 3), torch.tensor([2]), [PoolingParams(task="score")])
