"""Helpers of the sampler tests: hypothesis strategies for logits rows and parameters, and the
statistical check of empirical frequencies against the reference's exact probabilities."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

from toolkit.samplers import ReferenceSampler, Sampler, SamplingMetadata
from toolkit.types import SamplingParams

DELTA = 1e-5          # per-check false-alarm probability of a correct sampler
MAX_CELLS = 1_500_000  # draws x V per example: keeps one example around a second


def tv_bound(p: np.ndarray, draws: int, delta: float = DELTA) -> float:
    """A total-variation radius that a correct sampler exceeds with probability <= delta.

    E[TV(emp, p)] <= 1/2 sum_i sqrt(p_i (1 - p_i) / D) (Jensen, per token), and TV changes by
    at most 1/D when one draw changes, so McDiarmid gives P(TV >= E + t) <= exp(-2 D t^2).
    No asymptotics (unlike chi-square), so the bound holds at every V and D.
    """
    return 0.5 * float(np.sqrt(p * (1 - p) / draws).sum()) + math.sqrt(math.log(1 / delta) / (2 * draws))


@dataclasses.dataclass
class Verdict:
    ok: bool
    tv: float
    bound: float
    forbidden_hits: int   # draws of tokens whose reference probability is exactly 0

    def __str__(self) -> str:
        return f"tv={self.tv:.4f} bound={self.bound:.4f} forbidden_hits={self.forbidden_hits}"


def judge(tokens: torch.Tensor, probs: torch.Tensor) -> Verdict:
    """tokens int64 [D] drawn from one distribution, probs float64 [V] the exact target."""
    p = probs.numpy()
    d = tokens.numel()
    freq = np.bincount(tokens.numpy(), minlength=p.size) / d
    tv = 0.5 * float(np.abs(freq - p).sum())
    bound = tv_bound(p, d)
    hits = int((freq[p == 0] > 0).sum())
    return Verdict(hits == 0 and tv <= bound, tv, bound, hits)


def num_draws(v: int) -> int:
    return max(1000, min(10000, MAX_CELLS // v))


def replicated_meta(p: SamplingParams, prompt: list[int], output: list[int], eos: int | None,
                    v: int, draws: int) -> SamplingMetadata:
    return SamplingMetadata.build([p] * draws, [prompt] * draws, [output] * draws, v, "cpu",
                                  eos_token_ids=[eos] * draws)


def draw_many(sampler, logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int],
              eos: int | None, draws: int, seed: int = 0,
              meta: SamplingMetadata | None = None) -> torch.Tensor:
    """`draws` samples of one row, as one [draws, V] batch (the row replicated)."""
    v = logits.numel()
    meta = meta or replicated_meta(p, prompt, output, eos, v, draws)
    gen = torch.Generator().manual_seed(seed)
    return sampler(logits[None, :].expand(draws, v), meta, generator=gen).token_ids


def reference_probs(logits: torch.Tensor, p: SamplingParams, prompt, output, eos) -> torch.Tensor:
    meta = SamplingMetadata.build([p], [prompt], [output], logits.numel(), "cpu", eos_token_ids=[eos])
    return ReferenceSampler().probs(logits[None, :], meta)[0]


def robust(logits, p: SamplingParams, prompt, output, eos, rel: float = 1e-4) -> bool:
    """Whether the support survives nudging top_p / min_p by `rel`: float32 (fast) and float64
    (reference) may cut differently when a cut sits exactly on a boundary."""
    base = reference_probs(logits, p, prompt, output, eos) > 0
    for f in (1 - rel, 1 + rel):
        q = dataclasses.replace(p, top_p=min(1.0, p.top_p * f) if p.top_p < 1 else 1.0,
                                min_p=min(1.0, p.min_p * f))
        if not torch.equal(reference_probs(logits, q, prompt, output, eos) > 0, base):
            return False
    return True


# ---- strategies --------------------------------------------------------------------------

@st.composite
def logits_rows(draw, min_v: int = 2, max_v: int = 1500) -> torch.Tensor:
    """float32 [V]: values on a dyadic grid (exact in float32 and float64, so both paths see
    the same ties), with ties, -inf, huge and tiny scales; at least one finite entry."""
    v = draw(st.one_of(st.integers(min_v, max(min_v, min(max_v, 16))), st.integers(min_v, max_v)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    levels = draw(st.sampled_from([2, 5, 50, 1000]))              # few levels = many ties
    scale = 2.0 ** draw(st.integers(-8, 12))                     # tiny to huge spreads
    x = rng.integers(-levels, levels + 1, size=v).astype(np.float64) * scale / levels
    x = np.round(x * 64) / 64                                    # dyadic: exact everywhere
    ninf = draw(st.sampled_from([0.0, 0.0, 0.3, 0.9]))
    x[rng.random(v) < ninf] = -np.inf
    if not np.isfinite(x).any():
        x[rng.integers(v)] = 0.0
    return torch.tensor(x, dtype=torch.float32)


@st.composite
def sampling_cases(draw, v: int, greedy: bool | None = False):
    """(SamplingParams, prompt, output, eos) for a row of width v; dyadic penalties and
    temperatures keep the processed logits exact on both paths."""
    tok = st.integers(0, v - 1)
    temperature = 0.0 if greedy else draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]))
    kw = dict(
        temperature=temperature,
        top_k=draw(st.one_of(st.just(0), st.integers(1, v))),
        top_p=draw(st.one_of(st.just(1.0), st.floats(0.05, 1.0))),
        min_p=draw(st.one_of(st.just(0.0), st.floats(0.0, 0.5))),
        repetition_penalty=draw(st.sampled_from([1.0, 1.0, 0.5, 2.0])),
        presence_penalty=draw(st.sampled_from([0.0, 0.0, 0.5, -1.0])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.0, 0.25, -0.5])),
    )
    if draw(st.booleans()):
        kw["logit_bias"] = draw(st.dictionaries(tok, st.sampled_from([-100.0, -2.0, 0.5, 3.0]), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        kw["allowed_token_ids"] = draw(st.lists(tok, min_size=1, max_size=8))
    if draw(st.booleans()):
        kw["bad_words"] = draw(st.lists(st.lists(tok, min_size=1, max_size=2), max_size=3))
    prompt = draw(st.lists(tok, min_size=1, max_size=6))
    output = draw(st.lists(tok, max_size=6))
    eos = draw(st.one_of(st.none(), tok))
    if draw(st.booleans()):
        kw["min_tokens"] = draw(st.integers(0, 8))
        kw["max_tokens"] = 16
        kw["stop_token_ids"] = draw(st.lists(tok, max_size=2))
    return SamplingParams(**kw), prompt, output, eos


def default_sampler() -> Sampler:
    return Sampler()
