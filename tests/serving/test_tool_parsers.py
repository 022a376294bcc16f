"""The output parsers against their reference twins: for golden outputs of each format
(content, reasoning, one and several calls, JSON with nested braces, escaped quotes and
unicode, text around the calls), every split into stream deltas assembles to exactly the
one-shot parse, which agrees with the reference parse. Noise: any text, any split, the same
result as one feed, and never an exception."""

from __future__ import annotations

import itertools
import json
import keyword

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.serving.tools import hermes, llama3_json, pythonic
from toolkit.serving.tools.deltas import assemble
from toolkit.serving.tools.machine import OutputParser, ReasoningTags
from toolkit.serving.tools.scan import JsonScanner

TOOLS = ["get_weather", "search", "f"]
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>"]
FRAGMENTS = ["<", "<tool", "</tool_", "<think", "</", "{", "}", "[", "]", '"', "\\", ";", ":",
             " ", "\n", "é", "名", "🙂", "name", "arguments"]

# -- strategies ---------------------------------------------------------------------------
ident = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
nasty_text = st.one_of(st.text(max_size=8), st.lists(st.sampled_from(FRAGMENTS + TAGS), max_size=5).map("".join))
leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                 st.floats(allow_nan=False, allow_infinity=False, width=32), nasty_text)
json_value = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(nasty_text, inner, max_size=3)), max_leaves=8)
json_args = st.dictionaries(nasty_text, json_value, max_size=4)
py_args = st.dictionaries(ident, json_value, max_size=3)


def _free_of_tags(s: str) -> bool:
    return not any(t in s for t in TAGS)


content_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=6).map("".join).filter(_free_of_tags)
reason_text = content_text


@st.composite
def json_call(draw, name_key="name", args_key="arguments"):
    name, args = draw(st.sampled_from(TOOLS)), draw(json_args)
    obj = {name_key: name, args_key: args}
    if draw(st.booleans()):
        obj = {args_key: args, name_key: name}                   # arguments first
    kw = draw(st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}]))
    return name, args, json.dumps(obj, **kw)


@st.composite
def hermes_output(draw):
    parts, calls = [], []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["content", "think", "call"]))
        if kind == "content":
            parts.append(draw(content_text))
        elif kind == "think":
            parts.append("<think>" + draw(reason_text) + "</think>")
        else:
            name, args, text = draw(json_call())
            ws = draw(st.sampled_from(["", "\n", " \n"]))
            parts.append("<tool_call>" + ws + text + ws + "</tool_call>")
            calls.append((name, args))
    return "".join(parts), calls


@st.composite
def llama3_output(draw):
    head = ("<think>" + draw(reason_text) + "</think>") if draw(st.booleans()) else ""
    n = draw(st.integers(0, 3))
    calls = [draw(json_call(args_key="parameters")) for _ in range(n)]
    body = ("<|python_tag|>" if n and draw(st.booleans()) else "") + "; ".join(c[2] for c in calls)
    tail = draw(content_text.filter(lambda s: not s.lstrip(" \t\n\r").startswith((";", "{", "["))))
    return head + body + (" " if n else "") + tail, [(c[0], c[1]) for c in calls]


@st.composite
def pythonic_output(draw):
    n = draw(st.integers(0, 3))
    calls = [(draw(st.sampled_from(TOOLS)), draw(py_args)) for _ in range(n)]
    body = ("[" + ", ".join(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")"
                            for name, a in calls) + "]") if n else ""
    tail = draw(content_text.filter(lambda s: not s.lstrip(" \t\n\r").startswith(("[", "{"))))
    return body + " " + tail, calls


FORMATS = {"hermes": (hermes, hermes_output()), "llama3_json": (llama3_json, llama3_output()),
           "pythonic": (pythonic, pythonic_output())}


# -- helpers -------------------------------------------------------------------------------
def _parser(mod):
    ids = iter(range(10**6))
    return OutputParser(mod.FORMAT, ReasoningTags(), tools=TOOLS, id_factory=lambda: f"call_{next(ids)}")


def streamed(mod, text: str, cuts: list[int]):
    p = _parser(mod)
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    deltas = [p.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    deltas.append(p.finish())
    return assemble(deltas)


def check_against_reference(mod, text: str, expected_calls):
    one = _parser(mod).parse(text)
    content, reasoning, ref_calls = mod.reference_parse(text, TOOLS, ReasoningTags())
    assert ref_calls == expected_calls, "the golden output's calls are what the reference reads"
    assert (one.content, one.reasoning) == (content, reasoning)
    assert [(c.name, json.loads(c.arguments)) for c in one.tool_calls] == ref_calls
    return one


# -- golden outputs, every split -----------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@given(data=st.data())
def test_any_split_assembles_to_the_one_shot_parse(fmt, data):
    mod, outputs = FORMATS[fmt]
    text, calls = data.draw(outputs)
    one = check_against_reference(mod, text, calls)
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=12))
    assert streamed(mod, text, cuts) == one
    assert streamed(mod, text, list(range(len(text)))) == one      # one character at a time


GOLDEN = {
    "hermes": [
        (('Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "a}\\"{b", "n": [1, {"x": "}"}]}}'
         '\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich 名"}}\n</tool_call>'),
         [("search", {"q": 'a}"{b', "n": [1, {"x": "}"}]}), ("get_weather", {"city": "Zürich 名"})]),
        ("<think>First <tool_call> is only a word here.</think>\n\nThe answer is 4.", []),
        ('<tool_call>{"arguments": {"s": "<tool_call>\\u00e9"}, "name": "f"}</tool_call> done', [("f", {"s": "<tool_call>é"})]),
        # vLLM #28806: a parameterless call kept its empty arguments; #21544: braces in strings
        ('<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>',
         [("f", {}), ("f", {})]),
        ('<tool_call>\n{"name": "search", "arguments": {"q": "mkdir -p test/{test1,test2"}}\n</tool_call>',
         [("search", {"q": "mkdir -p test/{test1,test2"})]),
    ],
    "llama3_json": [
        ('<|python_tag|>{"name": "search", "parameters": {"q": "x;y"}}; {"name": "f", "parameters": {}}',
         [("search", {"q": "x;y"}), ("f", {})]),
        ('{"answer": 4} is not a call', []),
    ],
    "pythonic": [
        ('[search(q="a]b", n=[1, 2]), f()] and then', [("search", {"q": "a]b", "n": [1, 2]}), ("f", {})]),
        ("[not a call] text", []),
    ],
}


@pytest.mark.parametrize("fmt", sorted(GOLDEN))
def test_golden_outputs_every_single_cut(fmt):
    from toolkit.testing import check_tool_format

    check_tool_format(FORMATS[fmt][0], GOLDEN[fmt], tools=TOOLS, reasoning=ReasoningTags())


def test_the_conformance_check_catches_a_wrong_reference():
    from toolkit.testing import check_tool_format

    with pytest.raises(AssertionError, match="reference"):
        check_tool_format(hermes, [('<tool_call>{"name": "f"}</tool_call>', [("f", {"x": 1})])], tools=TOOLS)


# -- the streaming shape -------------------------------------------------------------------
def test_first_call_delta_has_id_and_name_then_argument_fragments():
    p = _parser(hermes)
    text = '<tool_call>\n{"name": "search", "arguments": {"q": "hello world"}}\n</tool_call>'
    deltas = [p.feed(ch) for ch in text] + [p.finish()]
    pieces = [c for d in deltas for c in d.calls]
    assert pieces[0].id == "call_0" and pieces[0].name == "search"
    assert all(c.id is None and c.name is None for c in pieces[1:])
    assert len(pieces) > 5                                           # the arguments arrive in pieces
    assert "".join(c.arguments for c in pieces) == '{"q": "hello world"}'
    assert not any(d.content for d in deltas)                        # no tag text leaks as content


def test_several_calls_get_their_own_indices():
    p = _parser(hermes)
    d = p.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "search", '
               '"arguments": {"q": 1}}</tool_call>')
    assert [(c.index, c.name) for c in d.calls if c.name] == [(0, "f"), (1, "search")]


def test_unknown_name_or_bad_json_is_content_never_an_exception():
    for text in ['<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>',
                 "<tool_call>not json</tool_call>", '<tool_call>{"name": "f", "arguments": {"a": 1'] :
        out = _parser(hermes).parse(text)
        assert out.tool_calls == [] and out.content == text


def test_a_cut_off_call_streams_as_far_as_it_got():
    """Streaming cannot unsend a header: a call cut off (max_tokens) ends with what it had,
    as OpenAI's does at finish_reason "length"; the non-streamed answer makes it content."""
    text = '<tool_call>{"name": "f", "arguments": {"a": [1, 2'
    out = streamed(hermes, text, [])
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("f", '{"a": [1, 2')]


def test_deepseek_r1_starts_inside_reasoning():
    r = ReasoningTags(starts_inside=True)
    for text in ("I think.</think>Answer.", "<think>I think.</think>Answer."):
        out = OutputParser(None, r).parse(text)
        assert (out.reasoning, out.content) == ("I think.", "Answer.")


# -- noise: split invariance, no exception ------------------------------------------------
noise = st.lists(st.sampled_from(FRAGMENTS + TAGS + ['{"name": "f", "arguments": ', '"q"', "1", "true",
                                                     '{"name": "search", "parameters": {', "f(", ")"]),
                 max_size=25).map("".join)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@given(text=noise, cuts=st.lists(st.integers(0, 10**6), max_size=10))
def test_noise_any_split_equals_one_feed(fmt, text, cuts):
    mod = FORMATS[fmt][0]
    p = _parser(mod)
    whole = assemble([p.feed(text), p.finish()])
    assert streamed(mod, text, cuts) == whole
    parsed = _parser(mod).parse(text)                                # the non-streamed answer
    for c in parsed.tool_calls:
        assert c.name in TOOLS and isinstance(json.loads(c.arguments), dict)


# -- the JSON scanner against json.loads --------------------------------------------------
@given(value=json_value, kw=st.sampled_from([{}, {"indent": 1}, {"ensure_ascii": False}]))
def test_scanner_accepts_every_prefix_of_json(value, kw):
    text = json.dumps(value, **kw)
    s = JsonScanner()
    assert all(s.feed(c) for c in text)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        assert s.done                                                # numbers end at a delimiter


@given(text=st.lists(st.sampled_from(list('{}[]",:0123456789.-+eE tfalsenu\\') + ["true", "null", '"a"']),
                     max_size=20).map(lambda parts: "{" + "".join(parts)))
def test_scanner_agrees_with_json_loads_on_containers(text):
    s = JsonScanner()
    ok = all(s.feed(c) for c in text) and s.done
    try:
        json.loads(text)
        expected = True
    except ValueError:
        expected = False
    assert ok == expected, text
