"""One beam-search step against brute force over every (beam, token) extension."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.samplers.beam import beam_search_step, length_normalized


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), v=st.integers(1, 30), c=st.integers(1, 10), seed=st.integers(0, 1000),
       ties=st.booleans())
def test_beam_step_is_the_best_extensions(b: int, v: int, c: int, seed: int, ties: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    raw = (torch.randint(0, 3, (b, v), generator=g) if ties else torch.randn(b, v, generator=g)).double()
    logprobs = torch.log_softmax(raw, dim=-1)
    cum = (torch.randint(-3, 1, (b,), generator=g) if ties else torch.randn(b, generator=g)).double()
    step = beam_search_step(cum, logprobs, c)
    brute = sorted(((float(cum[i] + logprobs[i, t]), i, t) for i in range(b) for t in range(v)),
                   key=lambda s: (-s[0], s[1], s[2]))[:c]
    assert step.parents.tolist() == [i for _, i, _ in brute]
    assert step.tokens.tolist() == [t for _, _, t in brute]
    torch.testing.assert_close(step.scores, torch.tensor([s for s, _, _ in brute], dtype=torch.float64))


def test_length_normalized() -> None:
    assert length_normalized(-6.0, 3, 1.0) == -2.0
    assert length_normalized(-6.0, 4, 0.5) == -3.0
