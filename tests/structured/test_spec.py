"""Structured specs: valid forms build, bad input raises a ValueError that says what is wrong."""

from __future__ import annotations

import re

import pytest

from toolkit.samplers.grammar import Structured
from toolkit.samplers.grammar.spec import escape_regex
from toolkit.types import SamplingParams


def test_forms_reduce_to_regexes() -> None:
    assert Structured.regex("^[0-9]{3}$").to_regex() == "[0-9]{3}"
    assert Structured.regex(r"cost\$").to_regex() == r"cost\$"      # an escaped $ stays
    assert Structured.choice(["a.b", "c|d"]).to_regex() == r"(a\.b|c\|d)"
    assert Structured.json({"type": "integer"}).to_regex() == "(-)?(0|[1-9][0-9]*)"
    assert Structured.json('{"type": "boolean"}') == Structured.json({"type": "boolean"})
    assert Structured.json_object().to_regex().startswith(r"\{")
    assert SamplingParams(structured=Structured.choice(["x"])).structured.kind == "choice"


def test_specs_are_hashable_cache_keys() -> None:
    a, b = Structured.json({"type": "null"}), Structured.json({"type": "null"})
    assert a == b and hash(a) == hash(b)
    assert Structured.json({"type": "null"}, whitespace_pattern=" ?") != a


@pytest.mark.parametrize("text", ["a.b", "x|y", "(1+2)*3", "[x]{y}", "^$", "a-b~c#d&e", "é 日"])
def test_escape_regex_is_literal(text: str) -> None:
    assert re.fullmatch(escape_regex(text), text)


@pytest.mark.parametrize("make, match", [
    (lambda: Structured.regex(""), "non-empty pattern"),
    (lambda: Structured.regex("a(?=b)"), "lookaround"),
    (lambda: Structured.regex(r"(a)\1"), "backreference"),
    (lambda: Structured.regex(r"\bword"), "anchor or word boundary"),
    (lambda: Structured.regex("^$"), "empty after removing"),
    (lambda: Structured.json("{not json"), "not valid JSON"),
    (lambda: Structured.json([1, 2]), "must be a dict"),
    (lambda: Structured.json({"type": "frobnicate"}), "invalid JSON schema"),
    (lambda: Structured.json({"type": "integer", "minimum": 3}), "minimum"),
    (lambda: Structured.json({"type": "object", "properties": {"a": {"type": "string"}},
                              "required": ["b"]}), "required names"),
    (lambda: Structured.json({"type": "string", "format": "not-a-format"}), "cannot build a grammar"),
    (lambda: Structured.json({"$ref": "#/definitions/missing"}), "cannot build a grammar"),
    (lambda: Structured.choice([]), "non-empty list"),
    (lambda: Structured.choice("yes"), "non-empty list"),
    (lambda: Structured.json_object(depth=5), "depth must be"),
    (lambda: Structured.coerce({"yaml": "x"}), "one-key dict"),
    (lambda: Structured("grammar", "x"), "kind must be one of"),
])
def test_bad_specs_raise_clear_errors(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_non_strict_json_accepts_unenforced_keywords() -> None:
    spec = Structured.json({"type": "integer", "minimum": 3}, strict=False)
    assert spec.to_regex() == "(-)?(0|[1-9][0-9]*)"


def test_coerce_dict_forms() -> None:
    assert Structured.coerce({"regex": "a+"}) == Structured.regex("a+")
    assert Structured.coerce({"json": {"type": "null"}}) == Structured.json({"type": "null"})
    assert Structured.coerce({"choice": ["a", "b"]}) == Structured.choice(["a", "b"])
    assert Structured.coerce({"json_object": True}) == Structured.json_object()
    assert Structured.coerce(None) is None
