"""Sampler.graph_tail: the steps whose sampling is the fused tail alone, as fn(logits, **rows),
give the tokens __call__ gives (Triton under TRITON_INTERPRET=1 on the CPU; seeded rows, so
the keys are the same on both sides); every other step says None."""

from __future__ import annotations

import pytest
import torch

from toolkit.samplers import Sampler, SamplingMetadata
from toolkit.types import SamplingParams

DEV = "cuda" if torch.cuda.is_available() else "cpu"
V = 300


def _meta(params, **kw) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata.build(params, [[1, 2, 3]] * n, [[4]] * n, V, DEV, **kw)


@pytest.mark.parametrize("params", [
    [SamplingParams(temperature=0.7, seed=i) for i in range(5)],                   # temperature
    [SamplingParams(temperature=1.0, top_p=0.8, min_p=0.05, seed=i) for i in range(3)],
    [SamplingParams(temperature=0.0, seed=0), SamplingParams(temperature=0.9, seed=1)],   # a greedy row
])
def test_tail_function_gives_the_tokens_of_the_call(params):
    x = torch.randn(len(params), V, generator=torch.Generator().manual_seed(0)).to(DEV) * 3
    meta = _meta(params)
    sampler = Sampler(use_triton=True)
    fn, rows = sampler.graph_tail(meta)
    assert set(rows) == {"temperature", "greedy", "min_p", "top_k", "top_p", "keys"}
    assert all(t is None or t.shape == (len(params),) for t in rows.values())
    assert (rows["min_p"] is None) == all(p.min_p == 0 for p in params)
    got = fn(x.clone(), **rows)
    assert torch.equal(got, sampler(x.clone(), meta).token_ids)
    # and the twin's tokens: the torch path of the same pipeline (seeded rows, same keys)
    assert torch.equal(got, Sampler(use_triton=False)(x.clone(), meta).token_ids)


@pytest.mark.parametrize("why, params, kw", [
    ("every row greedy", [SamplingParams(temperature=0.0)] * 2, {}),
    ("logprobs", [SamplingParams(temperature=0.7, logprobs=2)], {}),
    ("a penalty stage active", [SamplingParams(temperature=0.7, repetition_penalty=1.2)], {}),
    ("top-k (its cut is its own kernel)", [SamplingParams(temperature=0.7, top_k=5)], {}),
    ("min_tokens bans EOS", [SamplingParams(temperature=0.7, min_tokens=3)], {}),
    ("a grammar's bitmask", [SamplingParams(temperature=0.7)],
     {"bitmask": torch.full((1, (V + 31) // 32), -1, dtype=torch.int32, device=DEV)}),
])
def test_steps_the_tail_does_not_cover_say_none(why, params, kw):
    meta = _meta(params, eos_token_ids=[0] * len(params), **kw)
    assert Sampler(use_triton=True).graph_tail(meta) is None, why


def test_no_graph_tail_off_triton_or_without_a_fused_tail():
    meta = _meta([SamplingParams(temperature=0.7, seed=1)])
    assert Sampler(use_triton=False).graph_tail(meta) is None
    s = Sampler(use_triton=True)
    s.insert_after("top_p", _Late())                   # a stage after the tail: no fused tail
    assert s.graph_tail(meta) is None


class _Late:
    name = "late"

    def __call__(self, logits, meta):
        return logits
