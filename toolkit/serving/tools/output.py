"""A chat choice's text as OpenAI's message (non-streamed) or delta (streamed) fields, with
tool calls and reasoning parsed out. The handlers call these two and nothing else."""

from __future__ import annotations

from typing import Any

from toolkit.serving.tools.deltas import Delta
from toolkit.serving.tools.machine import OutputParser
from toolkit.serving.tools.request import ToolPlan


def message_fields(plan: ToolPlan, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
    """({content, reasoning_content, tool_calls}, finish_reason) of a whole choice."""
    parser = plan.parser()
    if parser is None:
        return {"content": text}, reason
    out = parser.parse(text)
    calls = [c.to_openai() for c in out.tool_calls[:plan.max_calls]]
    return ({"content": out.content, "reasoning_content": out.reasoning, "tool_calls": calls or None},
            plan.finish_reason(reason, len(calls)))


class StreamedChoices:
    """One parser per streamed choice: each text delta becomes OpenAI delta fields."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.parsers: dict[int, OutputParser | None] = {}
        self.calls: dict[int, int] = {}            # choice index -> tool calls begun

    def delta(self, index: int, text: str, reason: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """(delta dict, or None when nothing is to be sent yet; finish_reason)."""
        if index not in self.parsers:
            self.parsers[index] = self.plan.parser()
        parser = self.parsers[index]
        if parser is None:
            return {"content": text}, reason
        d = parser.feed(text)
        if reason is not None:
            d.extend(parser.finish())
        if self.plan.max_calls is not None:
            d.calls = [c for c in d.calls if c.index < self.plan.max_calls]
        self.calls[index] = self.calls.get(index, 0) + sum(c.id is not None for c in d.calls)
        reason = self.plan.finish_reason(reason, self.calls[index])
        return (_delta_dict(d) if d else None), reason


def _delta_dict(d: Delta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if d.content:
        out["content"] = d.content
    if d.reasoning:
        out["reasoning_content"] = d.reasoning
    if d.calls:
        calls = []
        for c in d.calls:
            if c.id is not None:                   # the first piece: id, type and name
                calls.append({"index": c.index, "id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}})
            else:
                calls.append({"index": c.index, "function": {"arguments": c.arguments}})
        out["tool_calls"] = calls
    return out
