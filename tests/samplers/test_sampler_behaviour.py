"""Deterministic behaviour: stage-by-stage agreement with the reference on mixed batches,
greedy ties, seeds independent of the batch, logprobs and ranks, composing stages."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sampler_cases import logits_rows, robust, sampling_cases

from toolkit.kernels import reference_sampling
from toolkit.samplers import ReferenceSampler, Sampler, SamplingMetadata
from toolkit.samplers.reference import argmax_lowest
from toolkit.types import SamplingParams


@st.composite
def mixed_batches(draw, max_v: int = 400, greedy: bool | None = None):
    """(logits [N, V], rows) with each row's own params, prompt, output and eos."""
    v = draw(st.integers(2, max_v))
    n = draw(st.integers(1, 6))
    rows = [draw(sampling_cases(v, greedy=draw(st.booleans()) if greedy is None else greedy))
            for _ in range(n)]
    logits = torch.stack([draw(logits_rows(min_v=v, max_v=v)) for _ in range(n)])
    return logits, rows


def _meta(logits, rows) -> SamplingMetadata:
    return SamplingMetadata.build([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                  logits.shape[1], "cpu", eos_token_ids=[r[3] for r in rows])


@settings(max_examples=40, deadline=None)
@given(batch=mixed_batches())
def test_processed_logits_match_reference_row_by_row(batch) -> None:
    logits, rows = batch
    for i, (p, prompt, out, eos) in enumerate(rows):
        assume(p.greedy or robust(logits[i], p, prompt, out, eos))
    meta = _meta(logits, rows)
    fast = Sampler().process(logits, meta)                       # float32 [N, V]
    ref = ReferenceSampler()
    for i, (p, *_rest) in enumerate(rows):
        want = ref.process_row(logits[i], meta, i)                # float64 [V]
        if p.greedy:                                              # only the argmax matters
            assert int(torch.argmax(fast[i])) == argmax_lowest(want)
            continue
        assert torch.equal(torch.isinf(fast[i]), torch.isinf(want)), f"row {i}: support differs, {p}"
        finite = torch.isfinite(want)
        torch.testing.assert_close(fast[i][finite].double(), want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("min_p, cut", [(2.3e-72, False), (1e-300, False), (1e-30, True), (0.5, True)])
def test_min_p_below_float32_range_is_off_in_both(min_p: float, cut: bool) -> None:
    """min_p reaches the kernels as float32: a value that would round to 0 there is off, and the
    reference agrees (hypothesis found 2.3e-72 cutting in float64 and not in float32)."""
    logits = torch.tensor([[1.0, 0.5]])
    p = SamplingParams(temperature=0.25, min_p=min_p, logit_bias={0: -100.0})   # scaled [-396, 2]
    meta = _meta(logits, [(p, [0], [], None)])
    fast = Sampler().process(logits, meta)[0]
    want = ReferenceSampler().process_row(logits[0], meta, 0)
    assert bool(torch.isinf(fast[0])) == bool(torch.isinf(want[0])) == cut


@settings(max_examples=40, deadline=None)
@given(batch=mixed_batches(greedy=True), sampled_neighbour=st.booleans())
def test_greedy_is_argmax_lowest_id_on_ties(batch, sampled_neighbour: bool) -> None:
    logits, rows = batch
    if sampled_neighbour:                                         # the race path, not all-greedy
        rows = rows + [(SamplingParams(temperature=1.0), [0], [], None)]
        logits = torch.cat([logits, torch.zeros(1, logits.shape[1])])
    meta = _meta(logits, rows)
    fast = Sampler()(logits, meta).token_ids
    ref = ReferenceSampler()(logits, meta).token_ids
    for i, (p, *_r) in enumerate(rows):
        if p.greedy:
            assert int(fast[i]) == int(ref[i])
            x = ReferenceSampler().process_row(logits[i], meta, i)
            assert int(fast[i]) == int((x == x.max()).nonzero()[0]) or not torch.isfinite(x).any()


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0], [float("-inf")] * 5])
    meta = SamplingMetadata.build([SamplingParams(temperature=0.0)] * 2, [[0]] * 2, [[]] * 2, 5, "cpu")
    assert Sampler()(logits, meta).token_ids.tolist() == [1, 0]
    assert ReferenceSampler()(logits, meta).token_ids.tolist() == [1, 0]


@settings(max_examples=25, deadline=None)
@given(batch=mixed_batches(max_v=300), seed=st.integers(0, 2**63 - 1), n_out=st.integers(0, 5),
       where=st.integers(0, 6), gen_seed=st.integers(0, 100))
def test_seeded_row_ignores_the_batch(batch, seed: int, n_out: int, where: int, gen_seed: int) -> None:
    logits, rows = batch
    v = logits.shape[1]
    row = (SamplingParams(temperature=1.0, top_k=v // 2 + 1, seed=seed), [1], [0] * n_out, None)
    x = torch.linspace(-2, 2, v)
    alone = Sampler()(x[None], _meta(x[None], [row])).token_ids
    where = min(where, len(rows))
    rows2 = rows[:where] + [row] + rows[where:]
    logits2 = torch.cat([logits[:where], x[None], logits[where:]])
    gen = torch.Generator().manual_seed(gen_seed)
    mixed = Sampler(generator=gen)(logits2, _meta(logits2, rows2)).token_ids
    assert int(mixed[where]) == int(alone[0])


def test_seeded_row_changes_with_the_step_and_the_seed() -> None:
    x = torch.zeros(1, 1000)
    def tok(seed: int, step: int) -> int:
        meta = SamplingMetadata.build([SamplingParams(seed=seed)], [[0]], [[0] * step], 1000, "cpu")
        return int(Sampler()(x, meta).token_ids[0])
    assert tok(7, 3) == tok(7, 3)
    assert len({tok(7, s) for s in range(20)}) > 15
    assert len({tok(s, 3) for s in range(20)}) > 15


@settings(max_examples=30, deadline=None)
@given(batch=mixed_batches(max_v=300), k=st.integers(0, 8))
def test_logprobs_match_reference_log_softmax(batch, k: int) -> None:
    logits, rows = batch
    rows = [(SamplingParams(**{**_fields(p), "logprobs": k}), *r) for p, *r in rows]
    meta = _meta(logits, rows)
    out = Sampler()(logits, meta)
    n, v = logits.shape
    kk = min(k, v)
    assert out.logprobs.shape == (n, kk + 1) and out.logprob_token_ids.shape == (n, kk + 1)
    raw = logits.double()
    lp = torch.log_softmax(raw, dim=-1)
    for i in range(n):
        t = int(out.token_ids[i])
        assert int(out.logprob_token_ids[i, 0]) == t
        assert int(out.ranks[i]) == int((raw[i] >= raw[i, t]).sum())          # exact
        want = torch.cat([lp[i, t:t + 1], lp[i].sort(descending=True).values[:kk]])
        torch.testing.assert_close(out.logprobs[i].double(), want, rtol=1e-5, atol=1e-5)
        ids = out.logprob_token_ids[i, 1:]
        torch.testing.assert_close(lp[i, ids], want[1:], rtol=1e-5, atol=1e-5)  # ids carry them
    ref = ReferenceSampler()(logits, meta)
    assert ref.logprobs.shape == out.logprobs.shape
    torch.testing.assert_close(ref.logprobs[:, 1:], out.logprobs[:, 1:], rtol=1e-5, atol=1e-5)


def _fields(p: SamplingParams) -> dict:
    import dataclasses
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


def test_no_logprobs_unless_asked() -> None:
    meta = SamplingMetadata.build([SamplingParams()], [[0]], [[]], 8, "cpu")
    out = Sampler()(torch.zeros(1, 8), meta)
    assert out.logprobs is None and out.ranks is None and out.token_ids.dtype == torch.int64


class ForbidToken:
    """A user's stage: never sample `token` (to show a custom stage runs at its anchor)."""

    def __init__(self, token: int, name: str = "forbid") -> None:
        self.token, self.name = token, name

    def __call__(self, logits: torch.Tensor, meta) -> torch.Tensor:
        logits[:, self.token] = float("-inf")
        return logits


def test_custom_stage_insert_reorder_replace_remove() -> None:
    s = Sampler()
    s.insert_after("temperature", ForbidToken(0))
    assert s.names.index("forbid") == s.names.index("temperature") + 1
    meta = SamplingMetadata.build([SamplingParams(temperature=0.0)], [[0]], [[]], 4, "cpu")
    assert int(s(torch.tensor([[9.0, 1.0, 2.0, 0.0]]), meta).token_ids[0]) == 2
    trace: list = []
    s.process(torch.zeros(1, 4), meta, trace=trace)
    assert [n for n, _ in trace] == ["logits"] + s.names
    s.remove("forbid").insert_before("penalties", ForbidToken(2, "forbid2"))
    assert s.names[0] == "forbid2"
    s.replace("forbid2", ForbidToken(3, "forbid3"))
    assert s.names[0] == "forbid3" and "forbid2" not in s.names
    with pytest.raises(ValueError, match="no stage named 'nope'"):
        s.insert_after("nope", ForbidToken(1, "x"))
    with pytest.raises(ValueError, match="already"):
        s.insert_after("top_p", ForbidToken(1, "top_k"))
    with pytest.raises(ValueError, match="str `name`"):
        s.insert_after("top_p", lambda x, m: x)
    reordered = Sampler(stages=[st_ for st_ in Sampler().stages if st_.name != "temperature"])
    assert "temperature" not in reordered.names


def test_fused_tail_only_where_the_order_allows_and_same_tokens() -> None:
    from toolkit.samplers.stages import Temperature, fusable_tail

    s = Sampler()
    assert s.names[fusable_tail(s.stages):] == ["temperature", "min_p", "top_k", "top_p"]
    s.insert_after("top_p", ForbidToken(0))                  # a user stage last: nothing fuses
    assert fusable_tail(s.stages) == len(s.stages)
    s = Sampler().remove("min_p")
    assert s.names[fusable_tail(s.stages):] == ["temperature", "top_k", "top_p"]
    s = Sampler().remove("temperature")
    s.insert_after("top_p", Temperature())                   # out of order: only the last fuses
    assert s.names[fusable_tail(s.stages):] == ["temperature"]
    # whatever fuses, the tokens are those of the stages run one by one (all rows seeded)
    v, n = 300, 12
    x = torch.randn(n, v, generator=torch.Generator().manual_seed(3)) * 3
    params = [SamplingParams(temperature=0.5 + i % 3, top_k=(0, 5, 40)[i % 3], top_p=(1.0, 0.7)[i % 2],
                             min_p=(0.0, 0.1)[i % 2], seed=i) for i in range(n)]
    meta = SamplingMetadata.build(params, [[1]] * n, [[2]] * n, v, "cpu")
    for sampler in (Sampler(), s):
        staged = sampler.process(x, meta)
        want = reference_sampling.gumbel_sample(staged, sampler.keys(meta), meta.greedy)
        assert torch.equal(sampler(x, meta).token_ids, want)


@settings(max_examples=15, deadline=None)
@given(batch=mixed_batches(max_v=200, greedy=False))
def test_consumed_logits_give_the_same_tokens(batch) -> None:
    """consume_logits (the engine's own logits): processed in place, no copy, same tokens;
    the logprobs are still the raw logits' (rows a stage changes are saved first)."""
    logits, rows = batch
    meta = _meta(logits, rows)
    want = Sampler(generator=torch.Generator().manual_seed(0))(logits.clone(), meta)
    x = logits.clone()
    got = Sampler(generator=torch.Generator().manual_seed(0))(x, meta, consume_logits=True)
    assert torch.equal(got.token_ids, want.token_ids)
    if meta.max_num_logprobs is not None:
        torch.testing.assert_close(got.logprobs, want.logprobs, equal_nan=True)
        assert torch.equal(got.logprob_token_ids, want.logprob_token_ids)
        assert torch.equal(got.ranks, want.ranks)


class _Shift:
    """A user's stage: changes every row (the sampler cannot know which)."""

    name = "shift"

    def __call__(self, logits, meta):
        logits[:, 0] += 3.0
        return logits


@pytest.mark.parametrize("user_stage", [False, True])
@pytest.mark.parametrize("all_ask", [False, True])
def test_consumed_logits_keep_raw_logprobs(user_stage: bool, all_ask: bool) -> None:
    """In place with logprobs: rows asking for them whose logits a stage changes (penalties,
    bias, bans, allowed lists; with a user's stage, every row) are saved raw first, the others
    are read in place; every logprob equals the raw log_softmax."""
    v, n = 50, 6
    x0 = torch.randn(n, v, generator=torch.Generator().manual_seed(3)) * 2
    kinds = [dict(repetition_penalty=1.5), dict(logit_bias={0: 5.0}), dict(bad_words=[[1]]),
             dict(allowed_token_ids=[0, 1, 2]), dict(), dict(min_tokens=3)]
    params = [SamplingParams(temperature=1.0, seed=i, logprobs=2 if all_ask or i % 2 else None,
                             stop_token_ids=[0], **kinds[i]) for i in range(n)]
    meta = SamplingMetadata.build(params, [[0, 1, 2]] * n, [[4]] * n, v, "cpu")
    changed = meta.logprob_changed_rows.tolist()
    assert changed == ([0, 1, 2, 3, 5] if all_ask else [1, 3, 5])  # row 4 changes nothing
    sampler = Sampler(generator=torch.Generator().manual_seed(0))
    if user_stage:
        sampler.insert_before("temperature", _Shift())
    x = x0.clone()
    got = sampler(x, meta, consume_logits=True)
    assert not torch.equal(x, x0)                                   # processed in place
    want = reference_sampling.gather_logprobs(x0, got.token_ids, 2, meta.logprob_rows)
    torch.testing.assert_close(got.logprobs, want[0], equal_nan=True)
    assert torch.equal(got.logprob_token_ids, want[1]) and torch.equal(got.ranks, want[2])

