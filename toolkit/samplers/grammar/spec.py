"""`Structured`: what a request puts in `SamplingParams(structured=...)`.

    SamplingParams(structured=Structured.json({"type": "object", ...}))
    SamplingParams(structured=Structured.regex(r"[0-9]{3}-[0-9]{4}"))
    SamplingParams(structured=Structured.choice(["yes", "no"]))
    SamplingParams(structured=Structured.json_object())

A spec is a frozen, hashable value (the compile-cache key). Every form reduces to one
regex (`to_regex`) that outlines-core compiles against the tokenizer's vocabulary. The
output must match the whole regex (an implicit ^...$).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.samplers.grammar.limits import GrammarLimits
from toolkit.samplers.grammar.schema import load_schema, schema_to_regex

KINDS = ("regex", "json", "choice", "json_object")
_RUST_META = set("\\.+*?()|[]{}^$#&-~")       # what regex_syntax::escape escapes


def escape_regex(text: str) -> str:
    """`text` as a literal in outlines-core's (Rust) regex syntax, which Python's re also reads."""
    return "".join("\\" + c if c in _RUST_META else c for c in text)


def _strip_anchors(pattern: str) -> str:
    """Drop a leading '^' and a trailing unescaped '$': the whole output must match anyway, and
    outlines-core's DFA refuses anchors."""
    pattern = pattern.removeprefix("^")
    if pattern.endswith("$"):
        backslashes = len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            pattern = pattern[:-1]
    return pattern


def _unsupported_regex_features(pattern: str) -> list[str]:
    """Features outlines-core's DFA cannot build, found cheaply with Python's parser.

    Python and Rust syntax differ (Rust has \\p{L}, Python lacks it); a pattern Python cannot
    parse is left to the full compile, which reports Rust's own error.
    """
    try:
        from re import _parser as sre_parse  # the stdlib parser (3.11+)
    except ImportError:                          # pragma: no cover - Python 3.10
        import sre_parse  # type: ignore[no-redef]
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return []
    names = {"ASSERT": "lookaround", "ASSERT_NOT": "negative lookaround",
             "GROUPREF": "backreference", "GROUPREF_EXISTS": "conditional group",
             "AT": "anchor or word boundary inside the pattern"}
    found: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple)) or type(node).__name__ == "SubPattern":
            items = list(node)
            if len(items) == 2 and str(items[0]) in names:
                found.add(names[str(items[0])])
            stack.extend(x for x in items if isinstance(x, (list, tuple)) or
                         type(x).__name__ == "SubPattern")
    return sorted(found)


# the default bounds on what a request may ask to compile (GrammarLimits says why; past them
# a ValueError at add_request: a 400)
MAX_SPEC_CHARS = 64 << 10            # the schema's JSON text, the regex, the choices' JSON list
MAX_GRAMMAR_CHARS = 100_000          # the regex outlines-core compiles


@dataclass(frozen=True)
class Structured:
    """One grammar spec. Build it with the class methods, which validate their input."""

    kind: str                          # one of KINDS
    value: str                         # the regex, the schema's JSON text, or the choices' JSON list
    whitespace_pattern: str | None = None   # JSON only: what may stand between tokens
    strict: bool = True                # JSON only: refuse keywords outlines-core would ignore

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Structured.kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.value, str):
            raise ValueError(f"Structured.value must be a string, got {type(self.value).__name__}")

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def regex(cls, pattern: str) -> Structured:
        """Output fully matches `pattern` (outlines-core regex syntax; no lookaround/backrefs)."""
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"Structured.regex needs a non-empty pattern string, got {pattern!r}")
        spec = cls("regex", pattern)
        spec.validate()
        return spec

    @classmethod
    def json(cls, schema: dict | str, *, whitespace_pattern: str | None = None,
             strict: bool = True) -> Structured:
        """Output is JSON valid against `schema` (a dict or its JSON text)."""
        text = json.dumps(load_schema(schema), ensure_ascii=False)   # key order kept: it is output order
        spec = cls("json", text, whitespace_pattern, strict)
        spec.validate()
        return spec

    @classmethod
    def choice(cls, options: Sequence[str]) -> Structured:
        """Output is exactly one of `options`."""
        if isinstance(options, str) or not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError(f"Structured.choice needs a non-empty list of non-empty strings, got {options!r}")
        return cls("choice", json.dumps(list(dict.fromkeys(options)), ensure_ascii=False))

    @classmethod
    def json_object(cls, *, depth: int = 1, whitespace_pattern: str | None = None) -> Structured:
        """Any JSON object (no schema); values nest `depth` levels of objects/arrays (0..2:
        the regex, and its compile time, grow fast with depth)."""
        if depth not in (0, 1, 2):
            raise ValueError(f"Structured.json_object depth must be 0, 1 or 2, got {depth!r}")
        return cls("json_object", json.dumps({"type": "object", "depth": depth}), whitespace_pattern, False)

    @classmethod
    def coerce(cls, value: Any) -> Structured | None:
        """SamplingParams.structured as a spec: a Structured, None, or a one-key dict
        {"regex": str} / {"json": schema} / {"choice": [str]} / {"json_object": True}."""
        if value is None or isinstance(value, Structured):
            return value
        if isinstance(value, dict) and len(value) == 1:
            (kind, arg), = value.items()
            if kind == "regex":
                return cls.regex(arg)
            if kind == "json":
                return cls.json(arg)
            if kind == "choice":
                return cls.choice(arg)
            if kind == "json_object" and arg:
                return cls.json_object()
        raise ValueError("structured must be a toolkit.samplers.grammar.Structured or a one-key dict "
                         f"{{'regex': str}}, {{'json': schema}}, {{'choice': [str, ...]}} or "
                         f"{{'json_object': True}}; got {value!r}")

    # ---- what the compiler needs --------------------------------------------------------
    def to_regex(self) -> str:
        """The regex outlines-core compiles. Raises ValueError for a schema it cannot convert."""
        if self.kind == "regex":
            return _strip_anchors(self.value)
        if self.kind == "choice":
            return "(" + "|".join(escape_regex(o) for o in json.loads(self.value)) + ")"
        return schema_to_regex(json.loads(self.value), whitespace_pattern=self.whitespace_pattern,
                               strict=self.strict and self.kind == "json")

    def validate(self, limits: GrammarLimits | None = None) -> None:
        """Cheap checks (no DFA is built): raises ValueError saying what is wrong.

        The definitive check is the compile (`GrammarCompiler.compile_async`), whose future
        raises ValueError for what only the DFA build finds (a regex outside Rust's syntax,
        a vocabulary that cannot spell the pattern).
        """
        limits = limits if limits is not None else GrammarLimits()
        if len(self.value) > limits.max_spec_chars:
            raise ValueError(f"{self.describe()}: the spec has {len(self.value)} characters; at most "
                             f"{limits.max_spec_chars} are compiled (simplify the schema, regex or choices)")
        if self.kind == "json":
            limits.check_schema(json.loads(self.value), self.describe())
        regex = self.to_regex()
        if len(regex) > limits.max_grammar_chars:
            raise ValueError(f"{self.describe()}: as a regex this grammar has {len(regex)} characters; "
                             f"at most {limits.max_grammar_chars} compile in bounded time (optional properties "
                             "grow it fastest: mark properties required, or use fewer)")
        limits.check_regex(regex, self.describe(), ambiguity=self.kind == "regex")
        if not regex:
            raise ValueError(f"{self.describe()}: the pattern is empty after removing ^ and $ anchors")
        if self.kind == "regex" and not re.search(r"\\[pP]", regex):
            # Outside Rust-only classes (\p{..}), Python's parser agrees with outlines-core's on
            # syntax: catch plain syntax errors here, at add_request, not in the compile thread.
            try:
                re.compile(regex)
            except re.error as e:
                raise ValueError(f"{self.describe()}: invalid regex: {e}") from None
        bad = _unsupported_regex_features(regex) if self.kind == "regex" else []
        if bad:
            raise ValueError(f"{self.describe()}: outlines-core builds a DFA, which cannot have "
                             f"{', '.join(bad)}; rewrite the pattern without them")

    def describe(self, limit: int = 60) -> str:
        v = self.value if len(self.value) <= limit else self.value[:limit] + "..."
        return f"Structured.{self.kind}({v})"

    def __repr__(self) -> str:
        return self.describe()
