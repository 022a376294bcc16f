"""A conformance check for a tool-call format of one's own (a module like
toolkit/serving/tools/hermes.py): on golden outputs, the streaming parser agrees with the
format's reference twin, and every split of the text into deltas assembles to the one-shot
parse.

    from toolkit.testing import check_tool_format
    check_tool_format(my_format, [('<call>{"name": "f", "arguments": {}}</call>', [("f", {})])],
                      tools=["f"])
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from toolkit.serving.tools.deltas import ParsedOutput, assemble
from toolkit.serving.tools.machine import OutputParser, ReasoningTags


def _parser(fmt: ModuleType, tools: Sequence[str], reasoning: ReasoningTags | None) -> OutputParser:
    ids = iter(range(1 << 30))
    return OutputParser(fmt.FORMAT, reasoning, tools=list(tools), id_factory=lambda: f"call_{next(ids)}")


def streamed(fmt: ModuleType, text: str, bounds: Sequence[int], tools: Sequence[str],
             reasoning: ReasoningTags | None = None) -> ParsedOutput:
    """What a client assembles from the deltas of `text` cut at `bounds` (any ints)."""
    p = _parser(fmt, tools, reasoning)
    cuts = [0, *sorted({b % (len(text) + 1) for b in bounds}), len(text)]
    deltas = [p.feed(text[a:b]) for a, b in itertools.pairwise(cuts)]
    deltas.append(p.finish())
    return assemble(deltas)


def check_tool_format(fmt: ModuleType, outputs: Sequence[tuple[str, list[tuple[str, dict[str, Any]]]]],
                      *, tools: Sequence[str], reasoning: ReasoningTags | None = None) -> None:
    """Raises AssertionError naming the output (and the cut) where the format fails.
    reasoning: ReasoningTags() to read <think> blocks too."""
    for text, calls in outputs:
        one = _parser(fmt, tools, reasoning).parse(text)
        content, thought, ref_calls = fmt.reference_parse(text, list(tools), reasoning)
        assert ref_calls == calls, f"{text!r}: the reference reads {ref_calls}, expected {calls}"
        assert (one.content, one.reasoning) == (content, thought), \
            f"{text!r}: parsed content/reasoning {(one.content, one.reasoning)} != reference {(content, thought)}"
        got = [(c.name, json.loads(c.arguments)) for c in one.tool_calls]
        assert got == ref_calls, f"{text!r}: parsed calls {got} != reference {ref_calls}"
        for cut in range(len(text) + 1):
            assert streamed(fmt, text, [cut], tools, reasoning) == one, f"{text!r} cut at {cut}"
        assert streamed(fmt, text, range(len(text)), tools, reasoning) == one, f"{text!r} a character at a time"
