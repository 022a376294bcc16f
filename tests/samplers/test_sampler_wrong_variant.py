"""The statistical check has teeth: a top_p off by one token (either way) is caught, while the
correct sampler passes on the same cases."""

from __future__ import annotations

import pytest
import torch
from sampler_cases import draw_many, judge, reference_probs, replicated_meta

from toolkit.samplers import Sampler
from toolkit.types import SamplingParams


class OffByOneTopP:
    """top_p keeping `shift` more (+1) or fewer (-1) tokens than the rule says."""

    name = "top_p"

    def __init__(self, shift: int) -> None:
        self.shift = shift

    def __call__(self, logits: torch.Tensor, meta) -> torch.Tensor:
        if meta.top_p is None:
            return logits
        srt, idx = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        keep = (srt.cumsum(-1) < meta.top_p[:, None]).sum(-1) + 1 + self.shift   # [N]
        keep = keep.clamp(1, logits.shape[1])
        drop_sorted = torch.arange(logits.shape[1])[None, :] >= keep[:, None]
        drop = torch.zeros_like(drop_sorted).scatter_(1, idx, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))


def _case(seed: int) -> tuple[torch.Tensor, SamplingParams]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, generator=g) * 1.5
    probs = torch.softmax(logits.double(), -1).sort(descending=True).values
    m = next(i for i in range(2, 12) if probs[i] >= 0.08)        # the cut falls inside token m
    top_p = float(probs[:m].sum() + 0.5 * probs[m])
    return logits, SamplingParams(top_p=top_p)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_by_one_top_p_is_caught(seed: int) -> None:
    logits, p = _case(seed)
    probs = reference_probs(logits, p, [0], [], None)
    meta = replicated_meta(p, [0], [], None, logits.numel(), 10000)
    good = judge(draw_many(Sampler(), logits, p, [0], [], None, 10000, meta=meta), probs)
    assert good.ok, str(good)
    for shift in (+1, -1):
        wrong = Sampler().replace("top_p", OffByOneTopP(shift))
        verdict = judge(draw_many(wrong, logits, p, [0], [], None, 10000, meta=meta), probs)
        assert not verdict.ok, f"shift {shift} not caught: {verdict}"
