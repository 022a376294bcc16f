"""What an output parser yields: content, reasoning and tool-call deltas, and the whole
parsed output they assemble to."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class CallDelta:
    """A piece of tool call `index`: its first piece has the id and the name, the later
    ones only argument text (OpenAI's streaming shape)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class Delta:
    """What one feed of text produced."""

    content: str = ""
    reasoning: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)

    def add_call(self, index: int, *, id: str | None = None, name: str | None = None,
                 arguments: str = "") -> None:
        """Append argument text to the last piece of the same call, else a new piece."""
        if not arguments and id is None and name is None:
            return
        last = self.calls[-1] if self.calls else None
        if last is not None and last.index == index and id is None and name is None:
            last.arguments += arguments
        else:
            self.calls.append(CallDelta(index, id, name, arguments))

    def extend(self, other: Delta) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        for c in other.calls:
            self.add_call(c.index, id=c.id, name=c.name, arguments=c.arguments)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str                 # JSON text of an object, as the model wrote it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedOutput:
    """A whole completion: content (None when empty), reasoning (None when there was none)
    and the tool calls in order."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def assemble(deltas: list[Delta]) -> ParsedOutput:
    """The output a stream of deltas adds up to (what a client accumulating them sees)."""
    content, reasoning, saw_reasoning = "", "", False
    calls: dict[int, list[str]] = {}
    for d in deltas:
        content += d.content
        reasoning += d.reasoning
        saw_reasoning |= bool(d.reasoning)
        for c in d.calls:
            if c.index not in calls:
                if c.id is None or c.name is None:
                    raise ValueError(f"tool call {c.index}'s first delta lacks its id or name: {c}")
                calls[c.index] = [c.id, c.name, ""]
            elif c.id is not None or c.name is not None:
                raise ValueError(f"tool call {c.index} got a second id/name: {c}")
            calls[c.index][2] += c.arguments
    if sorted(calls) != list(range(len(calls))):
        raise ValueError(f"tool call indices are not 0..n-1: {sorted(calls)}")
    return ParsedOutput(content or None, reasoning if saw_reasoning else None,
                        [ToolCall(*calls[i]) for i in range(len(calls))])


def arguments_valid(arguments: str) -> bool:
    """Arguments text is one JSON object."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False
