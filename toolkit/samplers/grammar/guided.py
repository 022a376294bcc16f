"""vLLM's spellings of a grammar spec, read as a `Structured`.

    SamplingParams(guided_decoding=GuidedDecodingParams(json=schema))      # vLLM <= 0.10
    SamplingParams(structured_outputs=StructuredOutputsParams(regex="..."))  # vLLM >= 0.10.2
    SamplingParams(guided_decoding={"choice": ["yes", "no"]})             # the same, as a dict

Any object with vLLM's attribute names (json, regex, choice, grammar, json_object,
whitespace_pattern) or a dict with those keys is read; exactly one of json / regex /
choice / json_object must be set. `grammar` (EBNF / Lark) has no equivalent here:
outlines-core builds a DFA from a regex, so a context-free grammar is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.samplers.grammar.spec import Structured


@dataclass
class GuidedDecodingParams:
    """vLLM's GuidedDecodingParams (StructuredOutputsParams): set exactly one of json,
    regex, choice, json_object; `SamplingParams(guided_decoding=GuidedDecodingParams(...))`."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    grammar: str | None = None
    whitespace_pattern: str | None = None


StructuredOutputsParams = GuidedDecodingParams

_KINDS = ("json", "regex", "choice", "json_object", "grammar")
_IGNORED = ("backend", "disable_fallback", "disable_any_whitespace", "disable_additional_properties",
            "structural_tag", "whitespace_pattern")


def _fields(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(_KINDS) - set(_IGNORED))
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; valid keys: {sorted(_KINDS + _IGNORED)}")
        return dict(value)
    if any(hasattr(value, k) for k in _KINDS):
        return {k: getattr(value, k) for k in _KINDS + ("whitespace_pattern",) if hasattr(value, k)}
    raise TypeError(f"{where} must be a dict or a GuidedDecodingParams-like object with one of "
                    f"{list(_KINDS[:4])} set, got {type(value).__name__}")


def from_guided(value: Any, where: str = "guided_decoding") -> Structured:
    """A `Structured` from vLLM's GuidedDecodingParams / StructuredOutputsParams (or a dict)."""
    f = _fields(value, where)
    given = [k for k in _KINDS if f.get(k) not in (None, False)]
    if len(given) != 1:
        raise ValueError(f"{where} must set exactly one of {list(_KINDS[:4])}, got "
                         f"{given or 'none'}")
    kind, arg = given[0], f[given[0]]
    ws = f.get("whitespace_pattern")
    if kind == "grammar":
        raise ValueError(f"{where}.grammar (EBNF / Lark) is not supported: the toolkit compiles "
                         "regular languages only (outlines-core); use json, regex or choice")
    if kind == "regex":
        return Structured.regex(arg)
    if kind == "choice":
        return Structured.choice(list(arg) if isinstance(arg, (list, tuple)) else arg)
    if kind == "json_object":
        return Structured.json_object(whitespace_pattern=ws)
    if hasattr(arg, "model_json_schema"):          # a pydantic model class, as vLLM accepts
        arg = arg.model_json_schema()
    return Structured.json(arg, whitespace_pattern=ws)
