"""Small HTML builders for the components' `_repr_html_` (notebooks show them; a terminal
shows the `__repr__`). Plain strings, escaped; no JavaScript, no external styles.
"""

from __future__ import annotations

import html
from typing import Any, Mapping

_TABLE = "border-collapse:collapse;font:12px monospace;margin:2px 0"
_CELL = "border:1px solid #d1d5db;padding:1px 6px;text-align:left;vertical-align:top"


def _cell(value: Any) -> str:
    if isinstance(value, Raw):
        return value.html
    return html.escape(str(value))


class Raw:
    """Already-built HTML to put in a table cell unescaped (a nested table, a bar)."""

    def __init__(self, html_text: str) -> None:
        self.html = html_text

    def __str__(self) -> str:
        return self.html


def html_table(title: str, rows: Mapping[str, Any], *, kind: str | None = None) -> str:
    """A two-column table (name, value) under a bold title; `kind` is a data attribute the
    tests and the screenshot check find the table by."""
    body = "".join(f'<tr><th style="{_CELL}">{html.escape(str(k))}</th><td style="{_CELL}">{_cell(v)}</td></tr>'
                   for k, v in rows.items())
    attr = f' data-toolkit="{html.escape(kind)}"' if kind else ""
    return (f'<table{attr} style="{_TABLE}"><caption style="text-align:left;font-weight:bold">'
            f'{html.escape(title)}</caption>{body}</table>')


def chips(items: list[str], color: str = "#dbeafe", limit: int = 24) -> Raw:
    """Inline boxes, one per item (a queue's request ids; a pipeline's stages)."""
    shown = "".join(f'<span style="background:{color};border-radius:3px;padding:0 4px;margin:1px;'
                    f'display:inline-block">{html.escape(str(i))}</span>' for i in items[:limit])
    more = f" +{len(items) - limit} more" if len(items) > limit else ""
    return Raw((shown or "<i>empty</i>") + html.escape(more))


def bar(parts: list[tuple[str, float, str]], total: float, width: int = 240) -> Raw:
    """A horizontal stacked bar: (label, amount, color) over `total`."""
    total = max(total, 1e-9)
    segs = "".join(f'<div title="{html.escape(label)}: {amount:g}" style="width:{100 * amount / total:.2f}%;'
                   f'background:{color}"></div>' for label, amount, color in parts if amount > 0)
    legend = ", ".join(f"{html.escape(label)} {amount:g}" for label, amount, _ in parts)
    return Raw(f'<div style="display:flex;width:{width}px;height:10px;background:#e5e7eb;'
               f'border-radius:2px;overflow:hidden">{segs}</div><span style="font-size:11px">'
               f'{legend} of {total:g}</span>')
