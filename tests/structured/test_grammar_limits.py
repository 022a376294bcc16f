"""Issue 54 item 7: what a request may ask to compile is bounded (GrammarLimits), refused at
add_request with a ValueError before any compile starts: a started compile cannot be
interrupted, so huge schemas and exponential regexes must never reach a worker."""

from __future__ import annotations

import time

import pytest

from toolkit.samplers.grammar.limits import GrammarLimits
from toolkit.samplers.grammar.spec import Structured

pytest.importorskip("jsonschema")
pytest.importorskip("outlines_core")


@pytest.mark.parametrize("pattern, why", [
    ("(a|b)*a(a|b){12}", r"2\^12"),         # the review's 30 s regex
    ("[ab]*a[ab]{12}", r"2\^12"),
    (".*a.{12}", r"2\^12"),
    ("[a-z]{0,20000}", "20000 positions"),
    ("([0-9]{100}){200}", "20000 positions"),   # nested bounds multiply
])
def test_exponential_or_huge_regexes_are_refused(pattern, why):
    with pytest.raises(ValueError, match=why):
        Structured.regex(pattern)


@pytest.mark.parametrize("pattern", [
    "(a|b)*a(a|b){8}", "[0-9]{3}-[0-9]{4}", r"\d*-\d{10}", r"\d*\d{10}", ".*[a-z]{0,50}",
    '[^"]*"[^"]{2,50}"', "[a-z]*[0-9]{10}", "(ab){3}", "[a-z]{0,10000}",
])
def test_linear_regexes_pass(pattern):
    """Not refused (the ambiguity check is no blanket ban on counted repetition)."""
    spec = Structured.regex(pattern)
    assert (spec.kind, spec.value) == ("regex", pattern)


def test_many_optional_properties_are_refused_before_the_regex_is_built():
    """The regex grows with their square (3000 became 316M characters and minutes of CPU;
    1000 fit in the spec's 64k characters): now a quick ValueError, no regex built."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}
    t = time.perf_counter()
    with pytest.raises(ValueError, match="1000 optional properties"):
        Structured.json(schema)
    assert time.perf_counter() - t < 2.0


def test_schema_size_depth_and_patterns():
    with pytest.raises(ValueError, match="more than 4096 nodes"):
        Structured.json({"enum": list(range(5000))})
    deep: dict = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match="nests deeper than 32"):
        Structured.json(deep)
    with pytest.raises(ValueError, match="2\\^12"):
        Structured.json({"type": "string", "pattern": "(a|b)*a(a|b){12}"})
    # a schema's own bounded strings are not the ambiguous kind (its escapes are not followed)
    Structured.json({"type": "object", "properties": {"a": {"type": "string"},
                                                      "b": {"type": "string", "maxLength": 40}},
                     "required": ["a", "b"]})


def test_limits_are_checked_and_configurable():
    with pytest.raises(ValueError, match="max_repeat"):
        GrammarLimits(max_repeat=0)
    tight = GrammarLimits(max_repeat=5)
    spec = Structured("regex", "[0-9]{6}")          # built directly: only the compiler checks
    spec.validate()
    with pytest.raises(ValueError, match="at most 5"):
        spec.validate(tight)


def test_the_engine_refuses_past_its_limits_and_keeps_nothing():
    from toolkit import LLM, SamplingParams

    with pytest.raises(TypeError, match="grammar_limits"):    # refused before the model loads
        LLM(device="cpu", num_blocks=8, grammar_limits=5)
    from transformers import LlamaConfig

    from toolkit.models import default_model_path, load_tokenizer

    tok = load_tokenizer(default_model_path())          # a tiny random model with the real tokenizer
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=len(tok), max_position_embeddings=64)
    with LLM(cfg, tokenizer=tok, dtype="float32", device="cpu", max_num_seqs=2, num_blocks=16,
             grammar_limits={"max_repeat": 5}) as llm:
        e = llm.engine
        with pytest.raises(ValueError, match="at most 5"):
            e.add_request([1, 2, 3], SamplingParams(max_tokens=4, structured=Structured("regex", "[0-9]{6}")))
        assert e.structured.num_compiling == 0 and not e.has_unfinished()
