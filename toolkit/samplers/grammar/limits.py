"""GrammarLimits: what a request may ask to compile, checked at add_request (a ValueError,
the server's 400) before any work that grows with the spec.

A compile that has started cannot be interrupted (outlines-core builds the DFA and its
vocabulary index in native code, on a worker thread), so the bounds are on its input:

- `max_spec_chars` / `max_grammar_chars`: the spec's text and the regex it becomes. The DFA
  build's time grows with the regex; 30 optional properties are ~20k characters, 0.6 s.
- `max_schema_nodes` / `max_schema_depth`: a JSON schema's size (every object, array and
  value in it, enum values included) and nesting, checked before it is turned into a regex
  (that conversion itself grew to a 316M-character regex for 3000 optional properties).
- `max_optional_properties`: per object; the regex grows with the square of their number
  (64 already pass `max_grammar_chars`, so the refusal comes cheaply and says why).
- `max_repeat`: the largest counted repetition `{m,n}` unrolled (nested bounds multiplied):
  each unrolled position is DFA states walked against the whole vocabulary.
- `max_ambiguous_repeat`: a counted repetition after an unbounded loop that can eat the same
  characters (`(a|b)*a(a|b){12}`: the DFA must remember the last 13 characters, 2^13
  states, 30 s). The check follows one concatenation at a time (a heuristic: a pattern that
  hides the loop in another group is left to `compile_timeout_s`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_ALPHABET = 129                         # ASCII code points, and 128 for "any non-ASCII character"
_ALL = frozenset(range(_ALPHABET))
_OTHER = 128


@dataclass(frozen=True)
class GrammarLimits:
    max_spec_chars: int = 64 << 10
    max_grammar_chars: int = 100_000
    max_schema_nodes: int = 4096
    max_schema_depth: int = 32
    max_optional_properties: int = 64
    max_repeat: int = 10_000
    max_ambiguous_repeat: int = 8

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GrammarLimits.{name} must be an int >= 1, got {v!r}")

    def check_schema(self, schema: Any, what: str) -> None:
        """Size, depth and optional properties of a JSON schema (before its regex is built)."""
        nodes, stack = 0, [(schema, 1)]
        while stack:
            node, depth = stack.pop()
            nodes += 1
            if nodes > self.max_schema_nodes:
                raise ValueError(f"{what}: the JSON schema has more than {self.max_schema_nodes} nodes "
                                 "(objects, arrays, values and enum entries); split or simplify it")
            if depth > self.max_schema_depth:
                raise ValueError(f"{what}: the JSON schema nests deeper than {self.max_schema_depth} levels")
            if isinstance(node, dict):
                if isinstance(node.get("pattern"), str):       # a user's regex inside the schema
                    self.check_regex(node["pattern"], what)
                props = node.get("properties")
                if isinstance(props, dict):
                    required = node.get("required") if isinstance(node.get("required"), list) else []
                    optional = len(set(props) - set(required))
                    if optional > self.max_optional_properties:
                        raise ValueError(f"{what}: an object has {optional} optional properties; at most "
                                         f"{self.max_optional_properties} compile in bounded time "
                                         "(mark properties required, or use fewer)")
                stack.extend((v, depth + 1) for v in node.values())
            elif isinstance(node, list):
                stack.extend((v, depth + 1) for v in node)

    def check_regex(self, regex: str, what: str, ambiguity: bool = True) -> None:
        """Counted repetitions: their unrolled size, and (ambiguity=True: a user's pattern, not
        the regex a JSON schema becomes, whose string escapes the character-set view cannot
        follow) after an unbounded loop that can eat the same characters. A pattern Python
        cannot parse (Rust-only syntax) is left to the compile."""
        try:
            from re import _parser as sre_parse  # the stdlib parser (3.11+)
        except ImportError:                          # pragma: no cover - Python 3.10
            import sre_parse  # type: ignore[no-redef]
        try:
            tree = sre_parse.parse(regex)
        except (re.error, OverflowError, RecursionError):
            return
        self._walk(tree, 1, sre_parse, what, ambiguity)

    def _walk(self, seq: Any, scale: int, sre: Any, what: str, ambiguity: bool) -> None:
        items = list(seq)
        for i, (op, av) in enumerate(items):
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
                _lo, hi, body = av
                bounded = hi != sre.MAXREPEAT
                if bounded:
                    if scale * hi > self.max_repeat:
                        raise ValueError(f"{what}: a counted repetition unrolls to {scale * hi} positions; at "
                                         f"most {self.max_repeat} compile in bounded time")
                    if ambiguity and hi > self.max_ambiguous_repeat and self._ambiguous(items, i, sre):
                        raise ValueError(
                            f"{what}: a repetition of up to {hi} follows an unbounded loop over the same "
                            f"characters; its DFA grows as 2^{hi} (at most {self.max_ambiguous_repeat} "
                            "here): make the loop stop on a character the repetition cannot start with")
                self._walk(body, scale * (hi if bounded else 1), sre, what, ambiguity)
            elif op == sre.SUBPATTERN:
                self._walk(av[-1], scale, sre, what, ambiguity)
            elif op == sre.BRANCH:
                for b in av[1]:
                    self._walk(b, scale, sre, what, ambiguity)

    def _ambiguous(self, items: list, i: int, sre: Any) -> bool:
        """Whether items[i] (a counted repetition) needs a DFA state per subset of its
        positions: an earlier unbounded loop of the same concatenation can eat every item
        between (so any occurrence of them may be the start), and the repetition reads
        characters that are no start (`(a|b)*a(a|b){n}`, `.*a.{n}`). With nothing between,
        or a repetition of start characters only, the states are prefixes: linear."""
        target = _chars(items[i], sre)
        loop_chars: frozenset[int] | None = None
        between: set[int] = set()
        for op, av in reversed(items[:i]):
            chars = _chars((op, av), sre)
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[1] == sre.MAXREPEAT:
                loop_chars = chars
                break
            between |= chars
        if loop_chars is None or not between:
            return False
        # where the loop stops is unknown (it can eat what comes between), and the repetition
        # reads characters that do not mark a new start: the DFA tracks every start position
        return bool(target & loop_chars) and between <= loop_chars and not target <= between


def _chars(item: Any, sre: Any) -> frozenset[int]:
    """The characters an item can consume (over ASCII and one "non-ASCII" symbol)."""
    op, av = item
    if op == sre.LITERAL:
        return frozenset([av if av < 128 else _OTHER])
    if op == sre.NOT_LITERAL:
        return _ALL - {av} if av < 128 else _ALL
    if op == sre.ANY:
        return _ALL
    if op == sre.IN:
        out: set[int] = set()
        negate = False
        for o, a in av:
            if o == sre.NEGATE:
                negate = True
            elif o == sre.LITERAL:
                out.add(a if a < 128 else _OTHER)
            elif o == sre.RANGE:
                lo, hi = a
                out.update(range(min(lo, 128), min(hi, 127) + 1))
                if hi >= 128:
                    out.add(_OTHER)
            elif o == sre.CATEGORY:
                out |= _category(a, sre)
        return _ALL - out | {_OTHER} if negate else frozenset(out)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        return _seq_chars(av[2], sre)
    if op == sre.SUBPATTERN:
        return _seq_chars(av[-1], sre)
    if op == sre.BRANCH:
        return frozenset().union(*(_seq_chars(b, sre) for b in av[1]))
    if op == sre.CATEGORY:
        return _category(av, sre)
    return frozenset()                       # anchors and the like consume nothing


def _seq_chars(seq: Any, sre: Any) -> frozenset[int]:
    return frozenset().union(*(_chars(x, sre) for x in seq)) if len(seq) else frozenset()


def _category(cat: Any, sre: Any) -> frozenset[int]:
    name = str(cat).upper()
    digits = frozenset(range(48, 58)) | {_OTHER}
    word = digits | frozenset(range(65, 91)) | frozenset(range(97, 123)) | {95}
    space = frozenset(b" \t\n\r\x0b\x0c") | {_OTHER}
    base = digits if "DIGIT" in name else word if "WORD" in name else space if "SPACE" in name else _ALL
    return (_ALL - base) | {_OTHER} if "NOT" in name else base
