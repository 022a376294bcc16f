"""RejectionSampler on the samplers package: p is the sampler's processed distribution."""

from __future__ import annotations

import pytest
import torch
from spec_stats import ALPHA, chi_square_pvalue

from toolkit.samplers.base import SamplingMetadata
from toolkit.samplers.pipeline import Sampler
from toolkit.samplers.reference import ReferenceSampler
from toolkit.samplers.speculative.metrics import SpecDecodeStats
from toolkit.samplers.speculative.rejection import (
    RejectionSampler,
    SpecDecodeMetadata,
    target_probs,
)
from toolkit.types import SamplingParams

V = 12


def rows_meta(params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]],
              drafts: list[list[int]]) -> SamplingMetadata:
    """Metadata laid out like the runner's: 1 + k rows per request, row j after drafts[:j]."""
    p, pr, out = [], [], []
    for sp, prompt, o, d in zip(params, prompts, outputs, drafts):
        for j in range(len(d) + 1):
            p.append(sp)
            pr.append(prompt)
            out.append(o + d[:j])
    return SamplingMetadata.build(p, pr, out, V, "cpu")


PARAMS = [SamplingParams(temperature=0.7, top_p=0.8),
          SamplingParams(temperature=1.3, top_k=4, repetition_penalty=1.5, frequency_penalty=0.5),
          SamplingParams(temperature=0.0, presence_penalty=1.0),
          SamplingParams(temperature=1.0, min_p=0.1, seed=7)]


def test_target_is_the_reference_samplers_distribution():
    drafts = [[3, 1], [], [2], [5, 5, 0]]
    meta = rows_meta(PARAMS, [[1, 2, 3]] * 4, [[4, 3], [], [2, 2], [9]], drafts)
    logits = torch.randn(meta.num_rows, V, generator=torch.Generator().manual_seed(0)) * 2
    p = target_probs(Sampler().process(logits, meta))
    want = ReferenceSampler().probs(logits, meta)
    sampled = ~meta.greedy
    torch.testing.assert_close(p[sampled].double(), want[sampled], atol=1e-6, rtol=1e-5)


def test_emitted_first_token_follows_the_processed_target():
    n, sp = 3000, SamplingParams(temperature=0.8, top_k=5, frequency_penalty=1.0)
    gen = torch.Generator().manual_seed(1)
    logits_one = torch.randn(2, V, generator=gen)
    drafts = torch.randint(0, V, (n,), generator=gen).tolist()
    meta = rows_meta([sp] * n, [[1, 2]] * n, [[3, 3]] * n, [[d] for d in drafts])
    spec = SpecDecodeMetadata.build([[d] for d in drafts], V)
    logits = logits_one.repeat(n, 1)
    # the row-0 target is the same for every copy (its output is [3, 3] whatever the draft)
    p0 = ReferenceSampler().probs(logits[:1], rows_meta([sp], [[1, 2]], [[3, 3]], [[]]))[0]
    out = RejectionSampler(Sampler(generator=gen))(logits, meta, spec)
    first = torch.bincount(out.token_ids[:, 0], minlength=V)
    assert chi_square_pvalue(first, p0) > ALPHA


def test_greedy_requests_follow_the_samplers_argmax_chain():
    sp = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    gen = torch.Generator().manual_seed(2)
    drafts = [[4, 4, 4], [1], []]
    meta = rows_meta([sp] * 3, [[4, 1]] * 3, [[0]] * 3, drafts)
    logits = torch.randn(meta.num_rows, V, generator=gen)
    sampler = Sampler()
    logits[0, 4] = logits[0].max() + 5.0                               # make draft 0 of request 0 right
    greedy_tokens = sampler(logits, meta).token_ids.tolist()           # what decoding would emit
    out = RejectionSampler(sampler)(logits, meta, SpecDecodeMetadata.build(drafts, V)).tolist()
    starts = [0, 4, 6]
    for b, d in enumerate(drafts):
        want = []
        for j in range(len(d) + 1):
            want.append(greedy_tokens[starts[b] + j])
            if j == len(d) or d[j] != want[-1]:
                break
        assert out[b] == want


def test_seeded_requests_do_not_depend_on_the_batch():
    sp = SamplingParams(temperature=1.0, seed=123)
    gen = torch.Generator().manual_seed(3)
    d = [[2, 7]]
    logits = torch.randn(3, V, generator=gen)
    alone = RejectionSampler()(logits, rows_meta([sp], [[1]], [[5]], d), SpecDecodeMetadata.build(d, V))
    other = torch.randn(4, V, generator=gen)
    batch_logits = torch.cat([other, logits])
    params = [SamplingParams(temperature=1.0), sp]
    drafts = [[1, 1, 1], d[0]]
    batch = RejectionSampler()(batch_logits, rows_meta(params, [[1], [1]], [[2], [5]], drafts),
                               SpecDecodeMetadata.build(drafts, V))
    assert batch.tolist()[1] == alone.tolist()[0]


def test_draft_probs_mix_and_errors():
    spec = SpecDecodeMetadata.build([[1, 2], [3]], V, draft_probs=[None, torch.full((1, V), 1.0 / V)])
    assert spec.draft_probs is not None and spec.draft_probs.shape == (3, V)
    assert spec.draft_probs[0, 1] == 1.0 and spec.draft_probs[1, 2] == 1.0
    assert spec.row_starts.tolist() == [0, 3] and spec.num_rows == 5
    with pytest.raises(ValueError, match="must be in"):
        SpecDecodeMetadata.build([[V]], V)
    with pytest.raises(ValueError, match=r"draft_probs\[0\] must be"):
        SpecDecodeMetadata.build([[1]], V, draft_probs=[torch.ones(2, V)])
    meta = rows_meta([SamplingParams()], [[1]], [[]], [[]])
    with pytest.raises(ValueError, match="sum\\(1 \\+ k_b\\)"):
        RejectionSampler()(torch.zeros(1, V), meta, spec)


def test_metrics_count_drafted_accepted_and_emitted():
    stats = SpecDecodeStats()
    stats.observe(["a", "b"], [4, 0], [3, 1])      # a: 2 of 4 accepted; b: plain decode
    stats.observe(["a"], [4], [5])                 # a: all 4 accepted + bonus
    a = stats.per_request["a"]
    assert (a.steps, a.drafted, a.accepted, a.emitted) == (2, 8, 6, 8)
    assert a.acceptance_rate == 0.75 and a.mean_accepted_length == 4.0
    assert a.accepted_at == [2, 2, 1, 1]
    t = stats.total
    assert (t.steps, t.drafted, t.accepted) == (3, 8, 6) and t.mean_accepted_length == 3.0
    with pytest.raises(ValueError, match="accepted <= drafted"):
        stats.observe(["c"], [1], [3])
