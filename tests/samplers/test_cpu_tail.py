"""The CPU's race (samplers/cpu_tail.py) draws exactly the twin's tokens: noise hashed only for
the tokens a cut keeps, ties to the lowest id, greedy rows, rows of only -inf."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import reference_sampling as ref
from toolkit.samplers import cpu_tail
from toolkit.samplers.stages import kernel


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), v=st.sampled_from([5, 97, 1000]), seed=st.integers(0, 2**16),
       levels=st.sampled_from([3, 50, 0]), top_p=st.floats(0.05, 1.0),
       top_k=st.integers(0, 40), min_p=st.sampled_from([None, 0.0, 0.2]),
       greedy=st.lists(st.booleans(), min_size=6, max_size=6))
def test_truncated_sample_equals_twin(n, v, seed, levels, top_p, top_k, min_p, greedy) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g) * 3
    if levels:                                       # few distinct values: ties at the cuts
        x = (x * levels).round() / levels
    x[0, : v // 2] = float("-inf")                   # a masked half (grammar, bad words)
    keys = torch.randint(0, 2**62, (n,), generator=g)
    args = (torch.rand(n, generator=g) + 0.3, torch.tensor(greedy[:n]),
            None if min_p is None else torch.full((n,), min_p),
            torch.full((n,), top_k), torch.full((n,), top_p), keys)
    assert torch.equal(cpu_tail.truncated_sample(x.clone(), *args), ref.truncated_sample(x.clone(), *args))


def test_race_over_rows_of_only_minus_inf_and_wide_rows() -> None:
    x = torch.full((3, 50), float("-inf"))
    x[1, 7] = 0.5
    x[2] = torch.randn(50)                            # all kept: the twin's path
    keys, racing = torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.bool)
    got = cpu_tail.gumbel_sample(x, keys, racing)
    assert torch.equal(got, ref.gumbel_sample(x, keys, racing))
    assert got[:2].tolist() == [0, 7]


def test_the_cpu_picks_it() -> None:
    assert kernel("truncated_sample", torch.zeros(1, 4), None) is cpu_tail.truncated_sample
    assert kernel("top_k_top_p_threshold", torch.zeros(1, 4), None) is ref.top_k_top_p_threshold
