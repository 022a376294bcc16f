"""Parser names (vLLM's) -> parts, and which tool format a chat template speaks."""

from __future__ import annotations

import importlib
from types import ModuleType

from toolkit.serving.tools.machine import ReasoningTags

# --tool-call-parser NAME: the format module (FORMAT, system_prompt, render_call,
# render_result, grammar, reference_parse)
TOOL_PARSERS = {
    "hermes": "toolkit.serving.tools.hermes",
    "llama3_json": "toolkit.serving.tools.llama3_json",
    "pythonic": "toolkit.serving.tools.pythonic",
}
# --reasoning-parser NAME: where the reasoning block is
REASONING_PARSERS = {
    "qwen3": ReasoningTags(),                          # <think>...</think> in the output
    "deepseek_r1": ReasoningTags(starts_inside=True),  # the template opened <think> in the prompt
}


def tool_format(name: str) -> ModuleType:
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; valid: {sorted(TOOL_PARSERS)} "
                         "(or 'auto': chosen from the chat template)")
    return importlib.import_module(TOOL_PARSERS[name])


def reasoning_tags(name: str | None) -> ReasoningTags | None:
    if name is None:
        return None
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; valid: {sorted(REASONING_PARSERS)}")
    return REASONING_PARSERS[name]


def template_has_tools(template: str | None) -> bool:
    """The template renders a `tools` list itself (a Jinja variable of that name)."""
    return bool(template) and "tools" in template


def detect_tool_parser(template: str | None) -> str:
    """The format a template's tools section teaches: Hermes' <tool_call> tags, Llama 3's
    <|python_tag|> / "parameters" JSON; a template without a tools section gets the
    toolkit's default prompt, which teaches Hermes'."""
    if not template_has_tools(template) or "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or '"parameters"' in template:
        return "llama3_json"
    return "hermes"
