"""refuse_lone_surrogates: a 400 for any string of a request that is not valid Unicode.

JSON may carry a lone UTF-16 surrogate ("\\ud800"); Python keeps it in the str, and the
tokenizer, the chat template or the response's encoder then fail deep inside (a 500, the
connection dropped). One walk over the parsed body (keys too) finds it first and names
the field. ASCII strings are skipped at C speed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from toolkit.serving.protocol import ProtocolError


def refuse_lone_surrogates(value: Any, path: str = "") -> None:
    """Raise ProtocolError (400, param = the field's path, e.g. "messages.0.content") for
    the first string under `value` that holds a lone surrogate."""
    if isinstance(value, str):
        if value.isascii():
            return
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ProtocolError(f"{path or 'the body'} holds a lone UTF-16 surrogate "
                                f"({value[e.start]!a}) at character {e.start}; send valid Unicode text",
                                param=path or None) from None
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            refuse_lone_surrogates(getattr(value, name), _join(path, name))
        for name, v in (value.model_extra or {}).items():
            refuse_lone_surrogates(name, _join(path, "<key>"))
            refuse_lone_surrogates(v, _join(path, name))
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_lone_surrogates(k, _join(path, "<key>"))
            refuse_lone_surrogates(v, _join(path, str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_lone_surrogates(v, _join(path, str(i)))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
