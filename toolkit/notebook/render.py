"""A LiveState as HTML (the widget's panes; static, so it also renders without JavaScript)."""

from __future__ import annotations

import html

from toolkit.blocks.render import COLORS
from toolkit.display import bar
from toolkit.notebook.state import LiveState

_PREFILL, _DECODE = "#f59e0b", "#3b82f6"


def render_status(s: LiveState) -> str:
    """Step, throughput, queue depths, and the KV blocks in use as a bar."""
    kv = bar([("in use", s.kv_blocks_used, COLORS["held"])], s.kv_blocks_total)
    return (f'<div data-live="status" style="font:12px monospace">'
            f'<b>step {s.step + 1}</b> · {s.elapsed_s:.1f} s · {s.num_tokens} tokens · '
            f'{s.tokens_per_s:.1f} tokens/s<br>queues: <b>{s.num_running}</b> running · '
            f'<b>{s.num_waiting}</b> waiting · {s.num_preempted} preempted · {s.num_finished} finished'
            f'<div>KV blocks: {kv} · {s.kv_blocks_cached} hold a cached prefix</div></div>')


def render_timeline(s: LiveState, width: int = 480, height: int = 90) -> str:
    """Tokens per step as an SVG bar chart (prefill orange under decode blue), last steps."""
    steps = s.timeline
    top = max((p + d for _, p, d in steps), default=0) or 1
    w = width / max(len(steps), 1)
    bars = []
    for i, (_, p, d) in enumerate(steps):
        x = i * w
        hp, hd = height * p / top, height * d / top
        if p:
            bars.append(f'<rect x="{x:.1f}" y="{height - hp:.1f}" width="{max(w - 1, 1):.1f}" '
                        f'height="{hp:.1f}" fill="{_PREFILL}"/>')
        if d:
            bars.append(f'<rect x="{x:.1f}" y="{height - hp - hd:.1f}" width="{max(w - 1, 1):.1f}" '
                        f'height="{hd:.1f}" fill="{_DECODE}"/>')
    first = steps[0][0] if steps else 0
    return (f'<div data-live="timeline" style="font:11px monospace">tokens per step '
            f'(<span style="color:{_PREFILL}">prefill</span> / <span style="color:{_DECODE}">decode'
            f'</span>), max {top}<br><svg width="{width}" height="{height}" '
            f'style="background:#f9fafb;border:1px solid #e5e7eb">{"".join(bars)}</svg>'
            f'<br>steps {first + 1}..{first + len(steps)}</div>')


def render_blocks(s: LiveState, columns: int = 64) -> str:
    """The KV block map: one small square per cell, colored by state."""
    if s.block_cells is None:
        return '<div data-live="blocks" style="font:11px monospace">block map: not looked at yet</div>'
    per = s.blocks_per_cell
    owners = dict(s.block_owners)
    first = [f"blocks {i * per}-{i * per + per - 1}" if per > 1 else f"block {i}"
             for i in range(len(s.block_cells))]
    cells = "".join(f'<div title="{html.escape(f"{name}: {st}" + (f", held by {owners[i]}" if i in owners else ""))}"'
                    f' style="background:{COLORS[st]};width:8px;height:8px"></div>'
                    for i, (name, st) in enumerate(zip(first, s.block_cells)))
    legend = " ".join(f'<span style="background:{c};padding:0 4px">{k}</span>' for k, c in COLORS.items())
    unit = "block" if per == 1 else f"{per} blocks"
    return (f'<div data-live="blocks" style="font:11px monospace">KV block map (a cell = {unit})'
            f'<div style="display:grid;grid-template-columns:repeat({columns},8px);gap:1px;'
            f'margin:2px 0">{cells}</div>{legend}</div>')


def render_all(s: LiveState) -> str:
    return f'<div data-live="view">{render_status(s)}{render_timeline(s)}{render_blocks(s)}</div>'
