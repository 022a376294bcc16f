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
