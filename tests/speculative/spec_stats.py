"""Chi-square goodness of fit without scipy, and helpers to draw many verifications at once."""

from __future__ import annotations

import torch
from torch import Tensor

# per-check false-failure probability; a run makes well under 1000 checks, so a correct
# implementation fails a run with probability < 1e-4
ALPHA = 1e-7


def chi_square_pvalue(observed: Tensor, expected_probs: Tensor, min_expected: float = 5.0) -> float:
    """P-value of observed counts [C] against probabilities [C] (cells with tiny expectation
    are pooled so the chi-square approximation holds). Cells of probability 0 must be empty:
    a count there gives p-value 0."""
    obs = observed.to(torch.float64)
    prob = expected_probs.to(torch.float64)
    prob = prob / prob.sum()
    n = obs.sum()
    if bool((obs[prob == 0] > 0).any()):
        return 0.0
    exp = prob * n
    small = (exp < min_expected) & (prob > 0)
    big = exp >= min_expected
    o = torch.cat([obs[big], obs[small].sum()[None]]) if small.any() else obs[big]
    e = torch.cat([exp[big], exp[small].sum()[None]]) if small.any() else exp[big]
    if o.numel() < 2:
        return 1.0
    stat = ((o - e) ** 2 / e).sum()
    df = torch.tensor(float(o.numel() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def draw_from(probs: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """n samples of the distribution probs [V] -> int64 [n]."""
    return torch.multinomial(probs.to(torch.float64), n, replacement=True, generator=gen)


def rand_keys(n: int, gen: torch.Generator) -> Tensor:
    return torch.randint(0, 2 ** 62, (n,), generator=gen, dtype=torch.int64)
