"""Structured output through the engine with the embedded SmolLM2: constrained and free
requests in one batch, outputs that match their grammar, bad grammars rejected up front,
and greedy constrained decoding identical with speculation on and off."""

from __future__ import annotations

import json
import re

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("outlines_core")

from toolkit import LLM, SamplingParams
from toolkit.samplers.grammar import Structured  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    with LLM(dtype="float32", device="cpu", max_num_seqs=8) as engine:
        yield engine


def _chat(llm, text, params):
    return llm.chat([{"role": "user", "content": text}], params, use_tqdm=False)[0]


def test_mixed_batch_matches_grammars(llm):
    msgs = [[{"role": "user", "content": "Give me a JSON person named Ann, 31."}],
            [{"role": "user", "content": "Pick a colour."}],
            [{"role": "user", "content": "Say hello."}]]
    params = [SamplingParams(temperature=0, max_tokens=40, structured=Structured.json(SCHEMA)),
              SamplingParams(temperature=0.8, seed=1, max_tokens=10,
                             structured=Structured.choice(["red", "green", "blue"])),
              SamplingParams(temperature=0, max_tokens=8)]
    outs = llm.chat(msgs, params, use_tqdm=False)
    jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert outs[0].outputs[0].finish_reason == "stop"
    assert outs[1].text in {"red", "green", "blue"}
    assert outs[2].text  # the free request is untouched by the others' masks


def test_regex_and_greedy_spec_equal(llm, tmp_path):
    params = SamplingParams(temperature=0, max_tokens=20, structured=Structured.regex(r"[0-9]{3}-[a-z]{2,4}"))
    out = _chat(llm, "Write a code.", params)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", out.text), out.text
    with LLM(dtype="float32", device="cpu", speculative="ngram", num_speculative_tokens=3) as spec:
        out2 = spec.chat([{"role": "user", "content": "Write a code."}], params, use_tqdm=False)[0]
    assert out2.outputs[0].token_ids == out.outputs[0].token_ids


def test_bad_grammar_rejected_at_add_request(llm):
    with pytest.raises(ValueError):
        _chat(llm, "x", SamplingParams(structured=Structured.regex("(")))
    with pytest.raises(ValueError):
        SamplingParams(structured=Structured.json({"type": "no-such-type"}))
    assert not llm.engine.has_unfinished()
    assert _chat(llm, "Say hi.", SamplingParams(temperature=0, max_tokens=3)).token_ids


def test_grammar_ends_finish_with_their_reason(llm):
    """A grammar that can go no further ends its request with finish reason "grammar" (here:
    EOS is ignored, or forbidden by min_tokens, once the regex is complete); its output is
    exactly the grammar's text, with no token sampled after the end. The grammar takes each
    step's tokens one step later (overlapping the GPU), so this also checks that the extra
    step adds nothing. A free request in the same batch runs on; no KV block leaks."""
    free = llm.engine.scheduler.allocator.num_free_blocks()
    msgs = [[{"role": "user", "content": "Yes or no?"}],
            [{"role": "user", "content": "Two digits."}],
            [{"role": "user", "content": "Say hello."}]]
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                             structured=Structured.regex("(yes|no)")),
              SamplingParams(temperature=0.7, seed=3, max_tokens=20, min_tokens=6,
                             structured=Structured.regex("[0-9]{2}")),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    outs = llm.chat(msgs, params, use_tqdm=False)
    assert outs[0].text in {"yes", "no"} and outs[0].outputs[0].finish_reason == "grammar"
    assert re.fullmatch("[0-9]{2}", outs[1].text) and outs[1].outputs[0].finish_reason == "grammar"
    assert len(outs[2].outputs[0].token_ids) == 12 and outs[2].outputs[0].finish_reason == "length"
    assert not llm.engine.has_unfinished() and not llm.engine.structured._pending
    assert llm.engine.scheduler.allocator.num_free_blocks() == free
