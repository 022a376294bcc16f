"""The Triton rejection kernel against its float64 twin (interpreter on the CPU: small V, fp32)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import reference_spec as ref
from toolkit.kernels.rejection_sample import rejection_sample


def _case(ks: list[int], v: int, with_probs: bool, greedy: list[bool], seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    r, d = sum(ks) + len(ks), sum(ks)
    logits = torch.randn(r, v, generator=gen) * 3
    logits[torch.rand(r, v, generator=gen) < 0.3] = float("-inf")     # zero-mass tokens
    logits[:, 0] = torch.where(torch.isinf(logits).all(1), 0.0, logits[:, 0])
    probs = torch.softmax(logits, -1)
    amax = torch.argmax(probs, -1)
    ids = torch.randint(0, v, (d,), generator=gen)
    # half of the drafts copy the argmax, so long accepted prefixes happen
    rows = torch.cat([torch.arange(s, s + k) for s, k in zip(ref.spec_row_starts(torch.tensor(ks)).tolist(), ks)]
                     ) if d else torch.zeros(0, dtype=torch.int64)
    ids = torch.where(torch.rand(d, generator=gen) < 0.5, amax[rows], ids)
    dprobs = torch.softmax(torch.randn(d, v, generator=gen) * 2, -1) if with_probs else None
    keys = torch.randint(0, 2 ** 62, (r,), generator=gen)
    args = [probs, ids, dprobs, torch.tensor(ks, dtype=torch.int32), keys,
            torch.tensor(greedy), max(ks, default=0)]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


@settings(max_examples=15)
@given(ks=st.lists(st.integers(0, 4), min_size=1, max_size=5), v=st.sampled_from([2, 5, 37, 64]),
       with_probs=st.booleans(), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_kernel_equals_twin(ks, v, with_probs, data, seed):
    greedy = data.draw(st.lists(st.booleans(), min_size=len(ks), max_size=len(ks)))
    args = _case(ks, v, with_probs, greedy, seed)
    want_t, want_n = ref.rejection_sample(*args)
    got_t, got_n = rejection_sample(*args, block=16)                  # several vocabulary blocks
    assert torch.equal(got_n, want_n)
    assert torch.equal(got_t, want_t)


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
