"""The Hermes / Qwen format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
anywhere in the output, one block per call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolkit.samplers.grammar.spec import escape_regex
from toolkit.serving.tools._common import (
    alternation,
    args_regex,
    as_call,
    join_content,
    raw_decode,
    repeat,
    tool_list_json,
)
from toolkit.serving.tools.machine import ReasoningTags, ToolFormat

FORMAT = ToolFormat("hermes", open_tag="<tool_call>", close_tag="</tool_call>")


def system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """Qwen2.5's tools section, for templates that have none."""
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + tool_list_json(tools) + "\n</tools>\n\nFor each function call, return a json object with "
            "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def render_call(name: str, arguments: dict[str, Any]) -> str:
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            + "\n</tool_call>")


def render_result(content: str) -> str:
    return "<tool_response>\n" + content + "\n</tool_response>"


def grammar(tools: Sequence[dict[str, Any]], max_calls: int) -> str:
    """The regex of up to `max_calls` calls of `tools` (at least one)."""
    one = alternation([escape_regex('<tool_call>\n{"name": ' + json.dumps(t["function"]["name"])
                                    + ', "arguments": ') + args_regex(t) + escape_regex("}\n</tool_call>")
                       for t in tools])
    return repeat(one, "\n", max_calls)


def reference_parse(text: str, tools: Sequence[str] | None, reasoning: ReasoningTags | None = None
                    ) -> tuple[str | None, str | None, list[tuple[str, dict]]]:
    """The reference twin: (content, reasoning, [(name, arguments)]) by find + json.raw_decode."""
    segments, thoughts, calls = [], [], []
    i, n = 0, len(text)
    if reasoning is not None and reasoning.starts_inside:
        start = i + len(reasoning.open) if text.startswith(reasoning.open) else i
        end = text.find(reasoning.close, start)
        thoughts.append(text[start:] if end < 0 else text[start:end])
        i = n if end < 0 else end + len(reasoning.close)
    while i < n:
        opens = [(text.find(t, i), t) for t in (FORMAT.open_tag, reasoning and reasoning.open) if t]
        opens = [(j, t) for j, t in opens if j >= 0]
        if not opens:
            segments.append(text[i:])
            break
        j, tag = min(opens)
        if reasoning is not None and tag == reasoning.open:
            segments.append(text[i:j])
            end = text.find(reasoning.close, j + len(tag))
            thoughts.append(text[j + len(tag):] if end < 0 else text[j + len(tag):end])
            i = n if end < 0 else end + len(reasoning.close)
            continue
        got = raw_decode(text, j + len(tag))
        call = got and as_call(got[0], tools)
        if not call:                                  # not a call: the tag is text
            segments.append(text[i:j + len(tag)])
            i = j + len(tag)
            continue
        segments.append(text[i:j])
        calls.append(call)
        k = got[1]
        while k < n and text[k] in " \t\n\r":
            k += 1
        i = k + len(FORMAT.close_tag) if text.startswith(FORMAT.close_tag, k) else got[1]
    return join_content(segments), ("".join(thoughts) or None), calls
