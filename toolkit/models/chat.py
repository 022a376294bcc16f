"""Render a chat with the tokenizer's own Jinja template, as transformers does.

A sandboxed (immutable) jinja2 environment with trim_blocks / lstrip_blocks and the
helpers templates expect: `raise_exception`, `strftime_now`, and a `tojson` filter that
keeps non-ASCII text. The tokenizer's special tokens (bos_token, eos_token, ...) are
visible to the template, as in transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def chat_template_of(tokenizer: Any, name: str | None = None) -> str:
    """The tokenizer's template source (a named one when it has several)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        key = name or "default"
        if key not in template:
            raise ValueError(
                f"chat template {key!r} not found; the tokenizer has {sorted(template)}"
            )
        template = template[key]
    if not template:
        raise ValueError(
            "the tokenizer has no chat_template; pass a model folder whose tokenizer_config.json "
            "or chat_template.jinja defines one"
        )
    return template


def apply_chat_template(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """The prompt text of `messages` ([{"role": ..., "content": ...}, ...]) under the tokenizer's template.

    Extra keyword arguments (tools, documents, enable_thinking, ...) are passed to the template.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(
                f"messages[{i}] must be a mapping with a 'role' (and usually 'content'), got {m!r}"
            )
    special = {
        k: v
        for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
        if isinstance(v, str)
    }
    template = compile_template(chat_template_of(tokenizer, kwargs.pop("chat_template_name", None)))
    return template.render(
        messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        **{**special, **kwargs},
    )
