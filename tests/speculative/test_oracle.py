from __future__ import annotations

import pytest
import torch
from spec_stats import ALPHA, chi_square_pvalue

from toolkit.samplers.speculative.oracle import OracleProposer
from toolkit.types import Request, SamplingParams


def test_oracle_is_right_with_the_set_probability():
    future = list(range(1, 41))
    r = Request("a", [9, 9], SamplingParams(max_tokens=40))
    r.output_token_ids = future[:3]
    o = OracleProposer({(9, 9): future}, 0.6, seed=1)
    hits = total = 0
    for _ in range(2000):
        d = o.propose([r], 4)[0].token_ids
        assert len(d) == 4
        hits += sum(x == y for x, y in zip(d, future[3:7]))
        total += 4
    obs = torch.tensor([hits, total - hits])
    assert chi_square_pvalue(obs, torch.tensor([0.6, 0.4])) > ALPHA


def test_oracle_misaligned_and_unknown_requests():
    o = OracleProposer({(1,): [5, 6, 7]}, 1.0)
    r = Request("a", [1], SamplingParams(max_tokens=10))
    assert o.propose([r], 8)[0].token_ids == [5, 6, 7]      # the future ends: fewer drafts
    r.output_token_ids = [4]
    assert o.propose([r], 2)[0].token_ids == [] and o.num_misaligned == 1
    with pytest.raises(ValueError, match="no recorded future"):
        o.propose([Request("b", [2])], 2)
    with pytest.raises(ValueError, match=r"acceptance_rate must be in \[0, 1\]"):
        OracleProposer({}, 1.5)
