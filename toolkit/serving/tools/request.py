"""OpenAI's tool surface of one chat request, validated: `tools`, `tool_choice`,
`parallel_tool_calls`, and what follows from them: the output parser, the grammar that
forces a call (tool_choice "required" or a named function), the chat template's inputs.

Errors are `ProtocolError`s (HTTP 400) naming the field, e.g. `tools[1].function.name`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jsonschema

from toolkit.serving.protocol import ProtocolError
from toolkit.serving.tools.machine import OutputParser, ReasoningTags
from toolkit.serving.tools.registry import (
    detect_tool_parser,
    reasoning_tags,
    template_has_tools,
    tool_format,
)

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")      # OpenAI's rule for function names
MAX_FORCED_CALLS = 4                               # "required" + parallel: at most this many calls


@dataclass(frozen=True)
class ToolConfig:
    """The server's choices (vLLM's flags): --tool-call-parser, --enable-auto-tool-choice,
    --reasoning-parser. `resolve` fills in the format from the chat template."""

    tool_call_parser: str | ModuleType | None = None   # None / "auto": from the template; or a
    enable_auto_tool_choice: bool = True                # format module of one's own (FORMAT,
    reasoning_parser: str | None = None                 # system_prompt, render_call, ...: hermes.py)

    def resolve(self, template: str | None) -> ResolvedTools:
        name = self.tool_call_parser
        if isinstance(name, ModuleType):
            fmt, name = name, name.FORMAT.name
        else:
            if name in (None, "auto"):
                name = detect_tool_parser(template)
            fmt = tool_format(name)
        return ResolvedTools(name, fmt, self.enable_auto_tool_choice,
                             reasoning_tags(self.reasoning_parser), template_has_tools(template))


@dataclass(frozen=True)
class ResolvedTools:
    parser_name: str
    fmt: ModuleType
    auto: bool
    reasoning: ReasoningTags | None
    native: bool                                   # the template renders `tools` itself


@dataclass
class ToolPlan:
    """One request's tools. choice: "none" | "auto" | "required" | "named"."""

    tools: list[dict[str, Any]]
    choice: str
    named: str | None
    parallel: bool
    server: ResolvedTools

    @property
    def active(self) -> bool:
        """Tool calls are parsed from the output."""
        return bool(self.tools) and self.choice != "none"

    @property
    def parses(self) -> bool:
        """The output goes through a parser (tool calls, or reasoning)."""
        return self.active or self.server.reasoning is not None

    @property
    def max_calls(self) -> int | None:
        """parallel_tool_calls=false: the first call only (later ones are dropped)."""
        return None if self.parallel else 1

    def parser(self) -> OutputParser | None:
        """A fresh parser for one choice; None when there is nothing to parse."""
        # a forced call is the whole output (the grammar starts it): no reasoning block, even
        # where the template opened one (deepseek_r1)
        reasoning = None if self.choice in ("required", "named") else self.server.reasoning
        if not self.active and reasoning is None:
            return None
        names = [self.named] if self.choice == "named" else [t["function"]["name"] for t in self.tools]
        return OutputParser(self.server.fmt.FORMAT if self.active else None, reasoning, tools=set(names))

    def regex(self) -> str | None:
        """The regex forcing the calls ("required", "named"), or None."""
        if self.choice not in ("required", "named"):
            return None
        fmt = self.server.fmt
        if fmt.grammar is None:
            raise ProtocolError(f"tool_choice {self.choice!r} needs a JSON tool-call format (hermes, "
                                f"llama3_json); this server parses {self.server.parser_name}",
                                param="tool_choice")
        chosen = [(i, t) for i, t in enumerate(self.tools)
                  if self.choice == "required" or t["function"]["name"] == self.named]
        for i, t in chosen:                        # a schema outlines-core cannot build names its tool
            try:
                fmt.grammar([t], 1)
            except ValueError as e:
                raise ProtocolError(f"tools[{i}].function.parameters: {e}",
                                    param=f"tools[{i}].function.parameters") from None
        n = 1 if self.choice == "named" or not self.parallel else MAX_FORCED_CALLS
        return fmt.grammar([t for _, t in chosen], n)

    def finish_reason(self, reason: str | None, n_calls: int) -> str | None:
        """OpenAI's: "tool_calls" when the model stopped after calling (auto, required); a
        named function's call ends with "stop", as OpenAI's does."""
        if n_calls and reason == "stop" and self.choice in ("auto", "required"):
            return "tool_calls"
        return reason


def plan_tools(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None,
               server: ResolvedTools) -> ToolPlan:
    """Validate a request's tool fields against OpenAI's rules and this server's."""
    checked = [_check_tool(i, t) for i, t in enumerate(tools or [])]
    names = [t["function"]["name"] for t in checked]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProtocolError(f"tools: function names must be unique, {dup} appear twice", param="tools")
    choice, named = _check_choice(tool_choice, names)
    if choice == "auto" and checked and not server.auto:
        raise ProtocolError('"auto" tool choice requires --enable-auto-tool-choice and '
                            "--tool-call-parser to be set; use tool_choice \"required\", a named "
                            'function or "none"', param="tool_choice")
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    return ToolPlan(checked, choice, named, parallel, server)


def _check_tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise ProtocolError(f"{where} must be an object {{'type': 'function', 'function': {{...}}}}, "
                            f"got {type(tool).__name__}", param=where)
    if tool.get("type", "function") != "function":
        raise ProtocolError(f"{where}.type must be 'function', got {tool.get('type')!r}",
                            param=f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ProtocolError(f"{where}.function is required: an object with a name, and optionally a "
                            "description and parameters (a JSON schema)", param=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProtocolError(f"{where}.function.name must be 1 to 64 characters of a-z, A-Z, 0-9, _ "
                            f"and -, got {name!r}", param=f"{where}.function.name")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise ProtocolError(f"{where}.function.description must be a string",
                            param=f"{where}.function.description")
    params = fn.get("parameters")
    if params is not None:
        where_p = f"{where}.function.parameters"
        if not isinstance(params, dict):
            raise ProtocolError(f"{where_p} must be a JSON schema object, got {type(params).__name__}",
                                param=where_p)
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as e:
            at = "/".join(map(str, e.absolute_path)) or "#"
            raise ProtocolError(f"{where_p} is not a valid JSON schema (at {at}: {e.message})",
                                param=where_p) from None
        if params.get("type", "object") != "object":
            raise ProtocolError(f"{where_p} must describe an object (type 'object'), got type "
                                f"{params.get('type')!r}", param=where_p)
    out = {"type": "function", "function": {"name": name}}
    for k in ("description", "parameters", "strict"):
        if fn.get(k) is not None:
            out["function"][k] = fn[k]
    return out


def _check_choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ProtocolError(f"tool_choice must be 'none', 'auto', 'required' or "
                                f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
                                param="tool_choice")
        if choice != "none" and not names:
            raise ProtocolError(f"tool_choice {choice!r} needs tools; the request has none",
                                param="tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(choice, dict) or choice.get("type", "function") != "function" or not isinstance(name, str):
        raise ProtocolError("tool_choice as an object must be {'type': 'function', 'function': "
                            f"{{'name': ...}}}}, got {choice!r}", param="tool_choice")
    if name not in names:
        raise ProtocolError(f"tool_choice names function {name!r}, which is not among the tools "
                            f"{names}", param="tool_choice")
    return "named", name


def history_arguments(i: int, j: int, arguments: Any) -> dict[str, Any]:
    """An assistant message's tool call arguments (JSON text, as OpenAI sends them) as a dict."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProtocolError(f"messages[{i}].tool_calls[{j}].function.arguments must be JSON text of an "
                            f"object, got {arguments!r}"[:300], param=f"messages[{i}].tool_calls[{j}].function.arguments")
    return value
