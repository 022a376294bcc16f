"""Hypothesis strategies: regexes from a subset where Python's re and outlines-core's Rust
regex agree, and JSON schemas from the keywords outlines-core enforces."""

from __future__ import annotations

from hypothesis import strategies as st

from toolkit.samplers.grammar.spec import escape_regex

# literals include multi-byte UTF-8 characters, so walks cross partial-character tokens
_CHARS = "abcxyz0129 _-.,:\"{}é日"
_CLASSES = ["[a-f]", "[0-9]", "[xyz]", "[A-Z]", "[a-z0-9]", "[^a-z\"\\\\\\x00-\\x1f]"]


def _leaf() -> st.SearchStrategy[str]:
    literal = st.text(alphabet=_CHARS, min_size=1, max_size=4).map(escape_regex)
    return st.one_of(literal, st.sampled_from(_CLASSES))


def _quantified(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    bounded = st.tuples(st.integers(0, 2), st.integers(1, 3)).map(
        lambda mn: f"{{{min(mn)},{max(mn[0], mn[1])}}}")
    quant = st.one_of(st.sampled_from(["?", "*", "+"]), bounded)
    return st.tuples(inner, quant).map(lambda p: f"({p[0]}){p[1]}")


def regexes() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        concat = st.lists(inner, min_size=2, max_size=3).map("".join)
        alt = st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")")
        return st.one_of(concat, alt, _quantified(inner))
    return st.recursive(_leaf(), extend, max_leaves=6)


_NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


def _scalar_schemas() -> st.SearchStrategy[dict]:
    string = st.builds(
        lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
        st.integers(0, 2), st.integers(0, 6))
    return st.one_of(
        st.just({"type": "string"}), string, st.just({"type": "integer"}), st.just({"type": "number"}),
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.lists(st.one_of(st.text("abc é", min_size=1, max_size=4), st.integers(-5, 50)),
                 min_size=1, max_size=4, unique=True).map(lambda xs: {"enum": xs}),
        st.sampled_from([{"type": "string", "format": "date"}, {"type": "string", "pattern": "[a-c]{2}"},
                         {"const": "fixed"}]),
    )


def json_schemas() -> st.SearchStrategy[dict]:
    def extend(inner: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
        array = st.builds(lambda items, lo, span: {"type": "array", "items": items,
                                                   "minItems": lo, "maxItems": lo + span},
                          inner, st.integers(0, 1), st.integers(1, 2))
        obj = st.dictionaries(_NAMES, inner, min_size=1, max_size=3).flatmap(
            lambda props: st.sets(st.sampled_from(sorted(props))).map(
                lambda req: {"type": "object", "properties": props, "required": sorted(req)}))
        any_of = st.lists(inner, min_size=2, max_size=2).map(lambda xs: {"anyOf": xs})
        return st.one_of(array, obj, any_of)
    top = st.dictionaries(_NAMES, st.recursive(_scalar_schemas(), extend, max_leaves=4),
                          min_size=1, max_size=3)
    return top.flatmap(lambda props: st.sets(st.sampled_from(sorted(props))).map(
        lambda req: {"type": "object", "properties": props, "required": sorted(req)}))
