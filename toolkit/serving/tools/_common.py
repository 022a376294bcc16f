"""Helpers the format modules share: the tools' schemas as regexes, raw JSON decoding for
the reference twins, content under the whitespace rule."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolkit.samplers.grammar.spec import escape_regex

WS = " \t\n\r"
EMPTY_OBJECT = {"type": "object", "properties": {}}


def parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema; OpenAI's absent `parameters` is an empty argument list."""
    return tool["function"].get("parameters") or EMPTY_OBJECT


def args_regex(tool: dict[str, Any]) -> str:
    """The regex of a tool's arguments object. Keywords outlines-core does not enforce
    (minimum, ...) are constrained as far as it can (strict=False); `description` and
    `title` do not matter."""
    from toolkit.samplers.grammar.schema import schema_to_regex

    return schema_to_regex(parameters_of(tool), strict=False)


def alternation(parts: Sequence[str]) -> str:
    return "(" + "|".join(f"({p})" for p in parts) + ")"


def repeat(call: str, sep: str, max_calls: int) -> str:
    """`call`, then up to max_calls - 1 more, each after `sep` (a literal)."""
    if max_calls <= 1:
        return call
    return f"{call}({escape_regex(sep)}{call}){{0,{max_calls - 1}}}"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


DECODER = json.JSONDecoder(parse_constant=_no_constants)


def raw_decode(text: str, pos: int) -> tuple[Any, int] | None:
    """(value, end) of the JSON value at text[pos:] (after whitespace), or None."""
    while pos < len(text) and text[pos] in WS:
        pos += 1
    try:
        return DECODER.raw_decode(text, pos)
    except ValueError:
        return None


def join_content(segments: Sequence[str]) -> str | None:
    """The whitespace rule: each segment's trailing whitespace dropped, the whole's leading."""
    return "".join(s.rstrip(WS) for s in segments).lstrip(WS) or None


def as_call(obj: Any, tools: Sequence[str] | None, name_key: str = "name",
            arg_keys: Sequence[str] = ("arguments", "parameters")) -> tuple[str, dict] | None:
    """(name, arguments) if `obj` is a call object naming a known tool."""
    if not isinstance(obj, dict) or not isinstance(obj.get(name_key), str) or not obj[name_key]:
        return None
    if tools is not None and obj[name_key] not in tools:
        return None
    key = next((k for k in obj if k in arg_keys), None)
    args = obj[key] if key is not None else {}
    if not isinstance(args, dict):
        return None
    return obj[name_key], args


def tool_list_json(tools: Sequence[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
