"""The CPU's model ops (models/cpu_ops.py) against the twins in kernels/reference_model.py:
fp32 at odd shapes, strided q/k views of one qkv matmul, in place and into NaN-poisoned
outputs; other dtypes go through the twins themselves."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import reference_model as ref
from toolkit.models import cpu_ops
from toolkit.models.ops import model_ops


def cos_sin_cache(max_pos: int, d: int) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)        # [P, D/2]
    return torch.cat((f.cos(), f.sin()), dim=-1)                             # [P, D]


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 9), n=st.sampled_from([5, 17, 96, 123, 576]), residual=st.booleans(),
       into=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm_equals_twin(rows, n, residual, into, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 3
    w = torch.rand(n, generator=g) + 0.5
    r = torch.randn(rows, n, generator=g) if residual else None
    out = torch.full((rows, n), float("nan")) if into else None
    res_out = torch.full((rows, n), float("nan")) if into and residual else None
    got, got_res = cpu_ops.rms_norm(x, w, 1e-5, r, out=out, residual_out=res_out)
    want, want_res = ref.rms_norm(x, w, 1e-5, r)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)   # NaN fails assert_close
    assert torch.equal(got_res, want_res)
    if into:
        assert got.data_ptr() == out.data_ptr()
        assert res_out is None or got_res.data_ptr() == res_out.data_ptr()


@settings(max_examples=20, deadline=None)
@given(t=st.integers(1, 7), h_kv=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 3]),
       d=st.sampled_from([8, 64]), in_place=st.booleans(), seed=st.integers(0, 2**16))
def test_rotary_equals_twin_on_views_of_one_qkv(t, h_kv, group, d, in_place, seed) -> None:
    """q, k are strided views into one [T, (H + 2 Hkv) D] matmul output, as in the model."""
    g = torch.Generator().manual_seed(seed)
    h = h_kv * group
    qkv = torch.randn(t, (h + 2 * h_kv) * d, generator=g)
    positions = torch.randint(0, 50, (t,), generator=g)
    cache = cos_sin_cache(50, d)

    def views(x):
        q, k, _ = x.split([h * d, h_kv * d, h_kv * d], dim=-1)
        return q.view(t, h, d), k.view(t, h_kv, d)

    want = ref.rotary(positions, *views(qkv.clone()), cache)
    if in_place:
        mine = qkv.clone()
        got = cpu_ops.rotary(positions, *views(mine), cache)
        assert got[0].data_ptr() == mine.data_ptr()
    else:
        out = (torch.full((t, h, d), float("nan")), torch.full((t, h_kv, d), float("nan")))
        got = cpu_ops.rotary(positions, *views(qkv), cache, out=out)
        assert got[0] is out[0] and got[1] is out[1]
    for a, b in zip(got, want):
        assert torch.equal(a, b)     # the twin's ops in the twin's order: bit for bit


def test_silu_and_mul_equals_twin_and_checks_out() -> None:
    x = torch.randn(3, 2 * 37)
    assert torch.equal(cpu_ops.silu_and_mul(x), ref.silu_and_mul(x))
    out = torch.full((3, 37), float("nan"))
    assert cpu_ops.silu_and_mul(x, out=out) is out and torch.equal(out, ref.silu_and_mul(x))
    with pytest.raises(ValueError, match="out must be"):
        cpu_ops.silu_and_mul(x, out=torch.empty(3, 36))
    with pytest.raises(ValueError, match="even"):
        cpu_ops.silu_and_mul(torch.randn(2, 5))


def test_other_dtypes_go_through_the_twins() -> None:
    x = torch.randn(4, 32).bfloat16()
    w = (torch.rand(32) + 0.5).bfloat16()
    assert torch.equal(cpu_ops.rms_norm(x, w, 1e-6)[0], ref.rms_norm(x, w, 1e-6)[0])
    q, k = torch.randn(4, 2, 16).half(), torch.randn(4, 1, 16).half()
    pos = torch.arange(4)
    want = ref.rotary(pos, q.clone(), k.clone(), cos_sin_cache(8, 16))
    got = cpu_ops.rotary(pos, q, k, cos_sin_cache(8, 16))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_model_ops_picks_cpu_ops_on_the_cpu() -> None:
    assert model_ops("cpu").rotary is cpu_ops.rotary
    assert model_ops("cpu", kernels="torch").rotary is ref.rotary
    with pytest.raises(ValueError, match="kernels must be one of"):
        model_ops("cpu", kernels="fast")
