"""Speculative decoding inside the engine: greedy outputs with speculation on equal those with
it off, for the n-gram and the draft-model proposer, whatever k, batch and preemption."""

from __future__ import annotations

import random

import pytest

from toolkit import LLM, SamplingParams

MAX_NEW = 24


def _prompts(n: int = 5) -> list[list[int]]:
    rng = random.Random(1)
    base = [rng.randrange(3, 517) for _ in range(8)]
    # repetitive prompts give the n-gram proposer something to copy
    return [(base * 3)[: rng.randrange(6, 24)] + [rng.randrange(3, 517)] for _ in range(n)]


def _run(model_dir, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(model_dir, dtype="float32", device="cpu", **kw) as llm:
        outs = llm.generate(_prompts(), params, use_tqdm=False)
        e = llm.engine
        # per-request metrics add up to the engine's totals
        assert sum(o.metrics.num_spec_drafted for o in outs) == e.spec_drafted
        assert sum(o.metrics.num_spec_accepted for o in outs) == e.spec_accepted
        m = e.spec_metrics
        assert 0 <= m["acceptance_rate"] <= 1 and 1 <= m["mean_accepted_length"] <= 1 + kw.get(
            "num_speculative_tokens", 0)
        return [o.outputs[0].token_ids for o in outs], (e.spec_drafted, e.spec_accepted, e.num_preemptions)


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir):
    return _run(tiny_llama_dir)[0]


@pytest.mark.parametrize("k", [1, 3])
def test_ngram_greedy_identical(tiny_llama_dir, baseline, k):
    got, (drafted, accepted, _) = _run(tiny_llama_dir, speculative="ngram", num_speculative_tokens=k)
    assert got == baseline
    assert drafted > 0, "the repetitive prompts should give the n-gram proposer drafts"


def test_ngram_with_preemption_identical(tiny_llama_dir, baseline):
    got, (drafted, _, preempted) = _run(tiny_llama_dir, speculative="ngram", num_speculative_tokens=4,
                                        num_blocks=16, block_size=4, max_num_batched_tokens=32)
    assert got == baseline
    assert preempted > 0 and drafted > 0


def test_draft_model_greedy_identical(tiny_llama_dir, baseline):
    got, (drafted, accepted, _) = _run(tiny_llama_dir, speculative="draft", draft_model=1,
                                       num_speculative_tokens=3)
    assert got == baseline
    assert drafted > 0 and 0 <= accepted <= drafted


def test_full_model_as_draft_accepts_everything(tiny_llama_dir, baseline):
    """A draft equal to the target (all layers) must have every greedy draft accepted."""
    got, (drafted, accepted, _) = _run(tiny_llama_dir, speculative="draft", draft_model=2,
                                       num_speculative_tokens=3)
    assert got == baseline
    assert drafted > 0 and accepted == drafted


def test_sampled_draft_probs_reach_the_verifier(tiny_llama_dir):
    """A draft model that samples (temperature > 0) hands its q to the rejection sampler;
    with the draft equal to the target (all layers) and the same temperature, p == q, so
    every draft is accepted whatever was drawn."""
    from toolkit.models import load_model
    from toolkit.samplers.speculative.draft import DraftModelProposer

    draft = DraftModelProposer(load_model(tiny_llama_dir), num_blocks=64, block_size=16,
                               temperature=1.0, seed=1)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=5)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=64, proposer=draft,
             num_speculative_tokens=3) as llm:
        outs = llm.generate(_prompts()[:3], params, use_tqdm=False)
        e = llm.engine
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert e.spec_drafted > 0 and e.spec_accepted == e.spec_drafted


def test_logprobs_of_every_emitted_token_with_drafts(tiny_llama_dir):
    """With drafts, each emitted token (accepted drafts and the bonus) has its logprobs, and
    they equal those of the same tokens decoded without speculation."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)
    outs = {}
    for spec in (None, "ngram"):
        kw = dict(speculative="ngram", num_speculative_tokens=3) if spec else {}
        with LLM(tiny_llama_dir, dtype="float32", device="cpu", **kw) as llm:
            outs[spec] = llm.generate(_prompts(2), params, use_tqdm=False)
            drafted = llm.engine.spec_drafted
    assert drafted > 0
    for plain, fast in zip(outs[None], outs["ngram"]):
        p, f = plain.outputs[0], fast.outputs[0]
        assert f.token_ids == p.token_ids and len(f.logprobs) == len(f.token_ids) == 20
        for tok, a, b in zip(f.token_ids, p.logprobs, f.logprobs):
            assert set(a) == set(b) and tok in b and len(b) <= 2
            assert all(abs(a[t] - b[t]) < 1e-4 for t in a)
        assert abs(f.cumulative_logprob - p.cumulative_logprob) < 1e-3
