"""A chat history with tools as the chat template reads it.

A template with a tools section gets `tools=` and the history in Hugging Face's shape
(assistant `tool_calls` with arguments as dicts, `tool` messages as they are). A template
without one (the embedded SmolLM2's) gets the documented default: the format's tools prompt
in the system message, past calls written into the assistant's text in the format's own
syntax, and tool results as user turns (Hermes: inside <tool_response> tags), so every
template renders them.
"""

from __future__ import annotations

from typing import Any

from toolkit.serving.protocol import ProtocolError
from toolkit.serving.tools.request import ResolvedTools, ToolPlan, history_arguments


def render_inputs(messages: list[dict[str, Any]], plan: ToolPlan) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template kwargs) for `apply_chat_template`."""
    server = plan.server
    shown = plan.tools if plan.choice != "none" else []     # "none": the model is not told of tools
    out = [_hf_message(i, m) for i, m in enumerate(messages)]
    if server.native:
        return out, ({"tools": shown} if shown else {})
    out = [_plain_message(m, server) for m in out]
    if shown:
        prompt = server.fmt.system_prompt(shown)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": (out[0]["content"] + "\n\n" + prompt).lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, {}


def _hf_message(i: int, m: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's message as transformers' templates expect it: arguments as dicts."""
    calls = m.get("tool_calls")
    if calls is None:
        return m
    if m["role"] != "assistant" or not isinstance(calls, list):
        raise ProtocolError(f"messages[{i}].tool_calls must be a list, on an assistant message",
                            param=f"messages[{i}].tool_calls")
    fixed = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProtocolError(f"messages[{i}].tool_calls[{j}] must be {{'id', 'type': 'function', "
                                "'function': {'name', 'arguments'}}", param=f"messages[{i}].tool_calls[{j}]")
        fixed.append({**c, "type": "function",
                      "function": {"name": fn["name"], "arguments": history_arguments(i, j, fn.get("arguments"))}})
    return {**m, "tool_calls": fixed}


def _plain_message(m: dict[str, Any], server: ResolvedTools) -> dict[str, Any]:
    """Tool calls and results as text, for a template without a tools section."""
    fmt = server.fmt
    if m["role"] == "tool":
        return {"role": "user", "content": fmt.render_result(m.get("content") or "")}
    calls = m.get("tool_calls")
    if not calls:
        return {k: v for k, v in m.items() if k != "tool_calls"}
    text = "\n".join(fmt.render_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
    content = m.get("content") or ""
    rest = {k: v for k, v in m.items() if k not in ("tool_calls", "content")}
    return {**rest, "content": (content + "\n" + text) if content else text}
