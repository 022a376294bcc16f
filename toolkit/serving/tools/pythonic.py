"""The pythonic format (Llama 3.2 / 4's, vLLM's `pythonic`): the output starts with a Python
list of calls, `[get_weather(city="Paris"), get_time()]`, keyword arguments with literal
values. The list is parsed whole when its bracket closes, so a call's arguments arrive in one
delta rather than piece by piece."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolkit.serving.tools._common import WS, join_content, tool_list_json
from toolkit.serving.tools.machine import ReasoningTags, ToolFormat, parse_pythonic

FORMAT = ToolFormat("pythonic", kind="pythonic")


def system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    return ("You can call functions. To call them, respond with only a Python list of calls, "
            'like [func_name1(param="value"), func_name2(param=1)], and nothing else.\n'
            "The functions, as JSON:\n" + tool_list_json(tools))


def render_call(name: str, arguments: dict[str, Any]) -> str:
    return "[" + name + "(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")]"


def render_result(content: str) -> str:
    return content


grammar = None           # a Python-literal grammar is not built: required / named need a JSON format


def reference_parse(text: str, tools: Sequence[str] | None, reasoning: ReasoningTags | None = None
                    ) -> tuple[str | None, str | None, list[tuple[str, dict]]]:
    """The reference twin: the shortest prefix (after whitespace) that is a call list."""
    import json

    thoughts = None
    i = 0
    if reasoning is not None and text.lstrip(WS).startswith(reasoning.open):
        start = text.find(reasoning.open) + len(reasoning.open)
        end = text.find(reasoning.close, start)
        thoughts = text[start:] if end < 0 else text[start:end]
        i = len(text) if end < 0 else end + len(reasoning.close)
    body = text[i:]
    lead = len(body) - len(body.lstrip(WS))
    if body[lead:lead + 1] == "[":
        for k in range(lead, len(body)):
            if body[k] == "]":
                calls = parse_pythonic(body[lead:k + 1], tools)
                if calls is not None:
                    return (join_content([body[k + 1:]]), thoughts or None,
                            [(n, json.loads(a)) for n, a in calls])
    return join_content([body]), thoughts or None, []
