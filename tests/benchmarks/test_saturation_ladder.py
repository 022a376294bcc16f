"""benchmarks/sim_gpu_all.py's saturation ladder against a known threshold (no engine)."""

from __future__ import annotations

import math

import pytest

from benchmarks.sim_gpu_all import ladder


def threshold(mu: float):
    calls = []

    def is_over(rate: float):
        calls.append(rate)
        return rate > mu, {"overloaded": rate > mu}
    return is_over, calls


@pytest.mark.parametrize("mu", [20.0, 39.9, 48.3, 70.0])
def test_refinement_halves_the_bracket_around_the_threshold(mu) -> None:
    over, calls = threshold(mu)
    coarse, ok, tried = ladder(over, 0.8 * 39.9, 1.5625, 3)
    assert ok and len(tried) == len(calls)
    lo, hi = max(t["rate"] for t in tried if t["rate"] <= mu), min(t["rate"] for t in tried if t["rate"] > mu)
    assert lo <= mu < hi and math.isclose(coarse, math.sqrt(lo * hi))

    over, calls = threshold(mu)
    fine, ok, tried = ladder(over, 0.8 * 39.9, 1.5625, 3, refine=2)
    assert ok and sum(t.get("refine", False) for t in tried) == 2
    lo2 = max(t["rate"] for t in tried if not t["overloaded"])
    hi2 = min(t["rate"] for t in tried if t["overloaded"])
    assert lo2 <= mu < hi2
    assert math.log(hi2 / lo2) == pytest.approx(math.log(hi / lo) / 4)   # two halvings
    assert abs(math.log(fine / mu)) <= abs(math.log(hi / lo)) / 8 + 1e-12


def test_an_unbracketed_ladder_says_so() -> None:
    over, _ = threshold(1e9)            # never overloaded within the runs
    rate, ok, tried = ladder(over, 10.0, 2.0, 3, refine=2)
    assert not ok and rate == 40.0 and len(tried) == 3
