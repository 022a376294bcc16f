"""Batched LoRA kernels (shrink, expand) against their torch twins (kernels/reference_lora.py),
and the twins against a per-token loop. Hypothesis shapes: ranks 1-64, odd K / N, ragged
per-token adapter indices with -1 (no adapter), merged-projection slices. Shrink's output
is poisoned with NaN (every element must be written); NaN never compares equal. On the CPU
the Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py) in fp32 / fp16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import reference_lora as ref
from toolkit.kernels.lora_expand import lora_expand
from toolkit.kernels.lora_shrink import lora_shrink

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _indices(g, t, slots, runs):
    """[t + 3] slot per token (-1: none): ragged per token, or (runs) in runs of 1-40 tokens as
    a request's tokens are, so whole 16-token tiles of one adapter (and of none) occur."""
    if not runs:
        return torch.randint(-1, slots, (t + 3,), generator=g, dtype=torch.int32).to(DEVICE)
    out = []
    while len(out) < t + 3:
        out += [int(torch.randint(-1, slots, (1,), generator=g))] * int(torch.randint(1, 41, (1,), generator=g))
    return torch.tensor(out[:t + 3], dtype=torch.int32, device=DEVICE)


def _case(seed, t, k, r, slots, slices, dtype, runs=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(DEVICE, dtype)
    a = (torch.randn(slots, slices * r, k, generator=g) * 0.3).to(DEVICE, dtype)
    return x, a, _indices(g, t, slots, runs)


def _loop_shrink(x, a, idx):
    out = torch.zeros(x.shape[0], a.shape[1])
    for t in range(x.shape[0]):
        if idx[t] >= 0:
            out[t] = a[int(idx[t])].float() @ x[t].float()
    return out


@given(seed=st.integers(0, 2**16), t=st.integers(1, 40), k=st.sampled_from([1, 5, 33, 97, 130]),
       r=st.integers(1, 64), slots=st.integers(1, 4), slices=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float16]), runs=st.booleans())
def test_shrink_matches_twin(seed, t, k, r, slots, slices, dtype, runs):
    x, a, idx = _case(seed, t, k, r, slots, slices, dtype, runs)
    out = torch.full((t, slices * r), float("nan"), dtype=dtype, device=DEVICE)
    want = ref.lora_shrink(x, a, idx, torch.empty_like(out))
    got = lora_shrink(x, a, idx, out)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert (got[idx[:t] < 0] == 0).all()


@given(seed=st.integers(0, 2**16), t=st.integers(1, 40), r=st.integers(1, 64), slots=st.integers(1, 4),
       sizes=st.lists(st.integers(0, 48), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float16]), scale=st.sampled_from([1.0, 0.5, 2.0]),
       runs=st.booleans())
def test_expand_matches_twin(seed, t, r, slots, sizes, dtype, scale, runs):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    offs = [sum(sizes[:i]) for i in range(len(sizes))]
    slices = [(o, s, i * r) for i, (o, s) in enumerate(zip(offs, sizes))]
    y = torch.randn(t, n, generator=g).to(DEVICE, dtype)
    h = torch.randn(t, len(sizes) * r, generator=g).to(DEVICE)          # fp32, as the layer's shrink gives it
    b = (torch.randn(slots, n, r, generator=g) * 0.3).to(DEVICE, dtype)
    idx = _indices(g, t, slots, runs)[:t].long()
    want = ref.lora_expand(y.clone(), h, b, idx, slices, scale)
    got = lora_expand(y.clone(), h, b, idx, slices, scale)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(got[idx < 0], y[idx < 0], atol=0, rtol=0)      # no adapter: untouched


def test_each_kind_of_tile():
    """Tiles of one adapter (the GEMM path), of the base model (skipped / zeros) and mixed
    (per token), side by side."""
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([2] * 16 + [-1] * 16 + [0, 1, -1, 1, 2], dtype=torch.int32, device=DEVICE)
    t = idx.shape[0]
    x = torch.randn(t, 40, generator=g).to(DEVICE)
    a = torch.randn(3, 24, 40, generator=g).to(DEVICE)
    want = ref.lora_shrink(x, a, idx, torch.empty(t, 24, device=DEVICE))
    got = lora_shrink(x, a, idx, torch.full((t, 24), float("nan"), device=DEVICE))
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    b = torch.randn(3, 30, 12, generator=g).to(DEVICE)
    y = torch.randn(t, 30, generator=g).to(DEVICE)
    sl = [(0, 10, 0), (10, 20, 12)]
    torch.testing.assert_close(lora_expand(y.clone(), got, b, idx, sl), ref.lora_expand(y.clone(), got, b, idx, sl),
                               **TOL[torch.float32])


def test_twins_match_a_per_token_loop():
    x, a, idx = _case(3, 7, 11, 5, 3, 2, torch.float32)
    h = ref.lora_shrink(x, a, idx, torch.empty(7, 10, device=DEVICE))
    torch.testing.assert_close(h.cpu(), _loop_shrink(x.cpu(), a.cpu(), idx.cpu()))
    b = torch.randn(3, 9, 5, device=DEVICE)
    y = torch.randn(7, 9, device=DEVICE)
    got = ref.lora_expand(y.clone(), h, b, idx, [(0, 4, 0), (4, 5, 5)], 0.5)
    want = y.clone()
    for t in range(7):
        if idx[t] >= 0:
            s = int(idx[t])
            want[t, :4] += 0.5 * b[s, :4] @ h[t, :5]
            want[t, 4:] += 0.5 * b[s, 4:] @ h[t, 5:]
    torch.testing.assert_close(got, want)


def test_bad_shapes_raise():
    x, a, idx = _case(0, 3, 8, 4, 2, 1, torch.float32)
    with pytest.raises(ValueError, match="do not match"):
        lora_shrink(x, a, idx, torch.empty(3, 5, device=DEVICE))
    with pytest.raises(ValueError, match="outside"):
        lora_expand(torch.zeros(3, 6, device=DEVICE), torch.zeros(3, 4, device=DEVICE),
                    torch.zeros(2, 6, 4, device=DEVICE), idx, [(4, 4, 0)])


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 512])
def test_real_shapes_bf16(t):
    """8B shapes (4096 -> qkv 6144 / gate_up 28672), rank 16 x 3 slices, 8 slots, bf16."""
    x, a, idx = _case(1, t, 4096, 16, 8, 3, torch.bfloat16)
    out = torch.empty(t, 48, dtype=torch.bfloat16, device=DEVICE)
    h = lora_shrink(x, a, idx, out)
    torch.testing.assert_close(h, ref.lora_shrink(x, a, idx, torch.empty_like(out)), **TOL[torch.bfloat16])
    b = torch.randn(8, 6144, 16, dtype=torch.bfloat16, device=DEVICE) * 0.1
    y = torch.randn(t, 6144, dtype=torch.bfloat16, device=DEVICE)
    sl = [(0, 4096, 0), (4096, 1024, 16), (5120, 1024, 32)]
    torch.testing.assert_close(lora_expand(y.clone(), h, b, idx, sl), ref.lora_expand(y.clone(), h, b, idx, sl),
                               **TOL[torch.bfloat16])
