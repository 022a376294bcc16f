"""Block maps for notebooks and terminals: one cell per block, colored by state.

States: free (grey), held (blue; the number is the ref count), held and cached (green),
cached but unreferenced, i.e. evictable (amber). `owners` (name -> block ids) labels
each held block with the requests holding it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

COLORS = {"free": "#e5e7eb", "held": "#93c5fd", "shared": "#3b82f6",
          "cached": "#86efac", "evictable": "#fcd34d"}


def block_states(alloc: Any) -> list[tuple[str, int]]:
    """(state, ref count) for every block id of `alloc`."""
    if hasattr(alloc, "cached_blocks"):
        cached = set(alloc.cached_blocks())
    else:                                            # ReferenceAllocator keeps a hash_of dict
        cached = set(getattr(alloc, "hash_of", {}))
    out = []
    for b in range(alloc.num_blocks):
        r = alloc.ref_count(b)
        if r and b in cached:
            out.append(("cached", r))
        elif r:
            out.append(("shared" if r > 1 else "held", r))
        else:
            out.append(("evictable" if b in cached else "free", 0))
    return out


def _owners_of(owners: Mapping[str, Sequence[int]] | None) -> dict[int, list[str]]:
    by_block: dict[int, list[str]] = {}
    for name, ids in (owners or {}).items():
        for b in ids:
            by_block.setdefault(b, []).append(str(name))
    return by_block


def block_map_html(alloc: Any, owners: Mapping[str, Sequence[int]] | None = None,
                   title: str | None = None, columns: int = 16) -> str:
    """An HTML grid of the blocks; hover a cell for its id, state, ref count and owners."""
    states, by_block = block_states(alloc), _owners_of(owners)
    cells = []
    for b, (state, r) in enumerate(states):
        who = by_block.get(b, [])
        tip = html.escape(f"block {b}: {state}, ref {r}" + (f", held by {', '.join(who)}" if who else ""))
        label = html.escape(",".join(who)) if who else (str(r) if r else "")
        cells.append(f'<div title="{tip}" style="background:{COLORS[state]};padding:2px;'
                     f'border-radius:3px;font:10px monospace;text-align:center;overflow:hidden;'
                     f'white-space:nowrap"><b>{b}</b><br>{label or "&nbsp;"}</div>')
    legend = " ".join(f'<span style="background:{c};padding:0 6px;border-radius:3px">{s}</span>'
                      for s, c in COLORS.items())
    head = html.escape(title or repr(alloc))
    return (f'<div><div style="font:12px monospace;margin-bottom:4px">{head}</div>'
            f'<div style="display:grid;grid-template-columns:repeat({columns},minmax(44px,1fr));'
            f'gap:2px">{"".join(cells)}</div><div style="font:11px sans-serif;margin-top:4px">'
            f'{legend}</div></div>')


def block_map_rich(alloc: Any, owners: Mapping[str, Sequence[int]] | None = None) -> Any:
    """A rich Text: one colored cell per block (the ref count, '.' free, 'c' evictable)."""
    from rich.text import Text

    text = Text(repr(alloc) + "\n")
    for b, (state, r) in enumerate(block_states(alloc)):
        glyph = {"free": ".", "evictable": "c"}.get(state, str(min(r, 9)))
        text.append(f"{glyph:^3}", style=f"black on {COLORS[state]}")
        if (b + 1) % 32 == 0:
            text.append("\n")
    return text
