"""Property: every completed walk through a grammar, with real tokenizers of three families,
decodes to text that fully matches the regex / validates against the JSON schema; the fast
bitmask equals outlines-core's own at every step (checked inside the walk)."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import json_schemas, regexes
from walk import random_walk

from toolkit.samplers.grammar import Structured

# examples per family: bounded so tests/structured stays near a minute on 2 cores
REGEX_EXAMPLES = {"smollm2": 12, "gpt2": 10, "qwen3": 6}
JSON_EXAMPLES = {"smollm2": 6, "gpt2": 5, "qwen3": 3}
WALKS = 3
_SETTINGS = dict(deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _decode(tokenizer, compiled, ids: list[int]) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    # the grammar's byte view of the tokens agrees with the tokenizer's own decoding
    assert compiled.vocab.decode_bytes(ids).decode("utf-8") == text
    return text


@pytest.mark.parametrize("family", list(REGEX_EXAMPLES))
def test_regex_walks_match(zoo, family: str) -> None:
    tokenizer, compiler = zoo.tokenizer(family), zoo.compiler(family)

    @settings(max_examples=REGEX_EXAMPLES[family], **_SETTINGS)
    @given(pattern=regexes(), seed=st.integers(0, 2**16))
    def check(pattern: str, seed: int) -> None:
        compiled = compiler.compile(Structured.regex(pattern))
        rng = random.Random(seed)
        for _ in range(WALKS):
            walk = random_walk(compiled, rng, budget=12)
            text = _decode(tokenizer, compiled, walk.token_ids)
            assert re.fullmatch(pattern, text), (pattern, text)

    check()


@pytest.mark.parametrize("family", list(JSON_EXAMPLES))
def test_json_walks_validate(zoo, family: str) -> None:
    tokenizer, compiler = zoo.tokenizer(family), zoo.compiler(family)

    @settings(max_examples=JSON_EXAMPLES[family], **_SETTINGS)
    @given(schema=json_schemas(), seed=st.integers(0, 2**16))
    def check(schema: dict, seed: int) -> None:
        compiled = compiler.compile(Structured.json(schema))
        rng = random.Random(seed)
        for _ in range(WALKS):
            walk = random_walk(compiled, rng, budget=25, p_eos=0.5)
            text = _decode(tokenizer, compiled, walk.token_ids)
            jsonschema.validate(json.loads(text), schema)

    check()


def test_json_object_walks_parse(zoo) -> None:
    """JSON without a schema: any walk is a JSON object."""
    tokenizer, compiler = zoo.tokenizer("gpt2"), zoo.compiler("gpt2")
    compiled = compiler.compile(Structured.json_object(depth=0))
    rng = random.Random(0)
    for _ in range(4):
        text = _decode(tokenizer, compiled, random_walk(compiled, rng, budget=20).token_ids)
        assert isinstance(json.loads(text), dict), text
