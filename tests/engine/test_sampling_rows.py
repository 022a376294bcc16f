"""SamplingRows: the last step's SamplingMetadata is reused only while it is what a fresh
build would give (same request objects in the same order, every row static)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from toolkit import LLM, SamplingParams


def _same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), f.name
        elif f.name not in ("params", "prompt_token_ids", "output_token_ids", "eos_token_ids"):
            assert x == y, f.name


def _drive(model_dir: str, params: list[SamplingParams], steps: int) -> tuple[int, int]:
    """Runs the requests `steps` steps, checking every reused metadata against a fresh
    build; returns (steps that reused, steps that built)."""
    with LLM(model_dir, dtype="float32", device="cpu", num_blocks=64, block_size=4) as llm:
        eng, runner = llm.engine, llm.engine.runner
        rows, build = runner._rows, runner._build_metadata
        built = {"n": 0}

        def checked_build(batch, slots):
            built["n"] += 1
            return build(batch, slots)

        def checked_get(sampling, cacheable, make):
            before = rows.num_reused
            meta = get(sampling, cacheable, make)
            if rows.num_reused > before:          # reused: must equal what a build gives now
                _same(meta, build(runner._last_batch, None))
            return meta

        get = rows.get
        runner._build_metadata = checked_build
        rows.get = checked_get
        prepare = runner.prepare

        def keep(out, prev=None):
            runner._last_batch = prepare(out, prev)
            return runner._last_batch

        runner.prepare = keep
        for j, sp in enumerate(params):
            eng.add_request([3 + j, 40, 41, 42, 43], sp)
        for _ in range(steps):
            eng.step()
        return rows.num_reused, built["n"]


def test_steady_decode_reuses_the_metadata(tiny_llama_dir):
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=30, ignore_eos=True, logprobs=2)
    reused, built = _drive(tiny_llama_dir, [sp, SamplingParams(temperature=0, max_tokens=30)], 12)
    assert reused >= 9 and built <= 3


@pytest.mark.parametrize("dynamic", [dict(seed=7), dict(repetition_penalty=1.3),
                                     dict(frequency_penalty=0.5), dict(min_tokens=20),
                                     dict(bad_words=[[5, 6]])])
def test_rows_that_change_per_step_are_rebuilt(tiny_llama_dir, dynamic):
    sp = SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, **dynamic)
    reused, built = _drive(tiny_llama_dir, [sp, SamplingParams(temperature=0.5, max_tokens=30)], 10)
    # min_tokens=20 is static once 20 tokens are out (after these 10 steps); the rest never are
    assert reused == 0 and built == 10


def test_a_new_row_rebuilds(tiny_llama_dir):
    """Different rows (a request finishes) rebuild: the short one ends after 3 tokens."""
    sp = SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True)
    reused, built = _drive(tiny_llama_dir, [sp, SamplingParams(temperature=0.5, max_tokens=3, ignore_eos=True)], 10)
    assert built == 2 and reused == 8      # the first step, and the step after the short one ended
