"""Llama 3.1 / 3.2's JSON tool format: the output is the call, `{"name": ..., "parameters":
{...}}` (optionally after `<|python_tag|>`); several are separated by `;`. Calls stand only at
the start of the output; text after them is content."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolkit.samplers.grammar.spec import escape_regex
from toolkit.serving.tools._common import (
    WS,
    alternation,
    args_regex,
    as_call,
    join_content,
    raw_decode,
    repeat,
    tool_list_json,
)
from toolkit.serving.tools.machine import ReasoningTags, ToolFormat

FORMAT = ToolFormat("llama3_json", start_tags=("<|python_tag|>",), separator=";",
                    arg_keys=("parameters", "arguments"))


def system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """Llama 3.1's JSON tool-calling prompt, for templates that have none."""
    return ("Given the following functions, please respond with a JSON for a function call with its "
            "proper arguments that best answers the given prompt.\n\nRespond in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}. '
            "Do not use variables.\n\n" + tool_list_json(tools))


def render_call(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


def render_result(content: str) -> str:
    return content


def grammar(tools: Sequence[dict[str, Any]], max_calls: int) -> str:
    one = alternation([escape_regex('{"name": ' + json.dumps(t["function"]["name"]) + ', "parameters": ')
                       + args_regex(t) + escape_regex("}") for t in tools])
    return repeat(one, "; ", max_calls)


def reference_parse(text: str, tools: Sequence[str] | None, reasoning: ReasoningTags | None = None
                    ) -> tuple[str | None, str | None, list[tuple[str, dict]]]:
    """The reference twin (reasoning: a leading <think> block only)."""
    thoughts = None
    i = 0
    if reasoning is not None:
        lead = text.lstrip(WS)
        if reasoning.starts_inside or lead.startswith(reasoning.open):
            start = text.find(reasoning.open) + len(reasoning.open) if lead.startswith(reasoning.open) else 0
            end = text.find(reasoning.close, start)
            thoughts = text[start:] if end < 0 else text[start:end]
            i = len(text) if end < 0 else end + len(reasoning.close)
    calls = []
    while True:
        k = i
        while k < len(text) and text[k] in WS:
            k += 1
        if not calls and text.startswith("<|python_tag|>", k):
            k += len("<|python_tag|>")
        got = raw_decode(text, k)
        call = got and as_call(got[0], tools, arg_keys=FORMAT.arg_keys)
        if not call:
            break
        calls.append(call)
        i = got[1]
        k = i
        while k < len(text) and text[k] in WS:
            k += 1
        if not text.startswith(";", k):
            break
        i = k + 1
    return join_content([text[i:]]), thoughts or None, calls
