"""Statistical tests: the fast sampler's empirical frequencies against the reference's exact
probabilities, for hypothesis-generated logits and parameters; excluded tokens never drawn."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sampler_cases import (draw_many, judge, logits_rows, num_draws, reference_probs, robust,
                           sampling_cases)

from toolkit.samplers import Sampler, SamplingMetadata
from toolkit.types import SamplingParams


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fast_frequencies_match_reference(data: st.DataObject) -> None:
    logits = data.draw(logits_rows())
    p, prompt, output, eos = data.draw(sampling_cases(logits.numel()))
    probs = reference_probs(logits, p, prompt, output, eos)
    assume(probs.sum() > 0)                                    # some token is left to sample
    assume(robust(logits, p, prompt, output, eos))
    tokens = draw_many(Sampler(), logits, p, prompt, output, eos, num_draws(logits.numel()))
    verdict = judge(tokens, probs)
    assert verdict.ok, f"{verdict} params={p}"


@settings(max_examples=6, deadline=None)
@given(logits=logits_rows(max_v=300), seed=st.integers(0, 2**40))
def test_seeded_rows_across_seeds_follow_the_distribution(logits: torch.Tensor, seed: int) -> None:
    # the randomness comes only from the hash of (seed, step, token): one row per seed
    p = SamplingParams(temperature=1.0, top_k=50)
    probs = reference_probs(logits, p, [0], [], None)
    draws = 5000
    params = [SamplingParams(temperature=1.0, top_k=50, seed=seed + i) for i in range(draws)]
    meta = SamplingMetadata.build(params, [[0]] * draws, [[]] * draws, logits.numel(), "cpu")
    tokens = Sampler()(logits[None].expand(draws, -1), meta).token_ids
    verdict = judge(tokens, probs)
    assert verdict.ok, str(verdict)


def test_banned_tokens_never_drawn() -> None:
    v = 64
    logits = torch.zeros(v)                                    # uniform: every token likely
    eos = 5
    cases = [
        SamplingParams(allowed_token_ids=[1, 2, 3, 5]),
        SamplingParams(bad_words=[[7], [9, 10]], min_tokens=4, stop_token_ids=[11]),
        SamplingParams(top_k=3, logit_bias={40: 1.0, 41: 0.5, 42: 0.25}),
        SamplingParams(top_p=0.5, logit_bias={t: 2.0 for t in range(10)}),
        SamplingParams(min_p=0.5, logit_bias={20: 1.0, 21: 0.5}),
    ]
    output = [3, 9]                                            # bad word [9, 10] is one token away
    for p in cases:
        probs = reference_probs(logits, p, [1], output, eos)
        tokens = draw_many(Sampler(), logits, p, [1], output, eos, 3000)
        verdict = judge(tokens, probs)
        assert verdict.forbidden_hits == 0 and verdict.ok, f"{verdict} {p}"
        assert set(torch.nonzero(probs).flatten().tolist()) >= set(tokens.unique().tolist())
    # the bans themselves, spelled out
    assert reference_probs(logits, cases[1], [1], output, eos)[[5, 7, 10, 11]].sum() == 0
    assert torch.count_nonzero(reference_probs(logits, cases[2], [1], output, eos)) == 3
