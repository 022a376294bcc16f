"""An executed notebook as one static HTML page, opened in headless Chromium.

The page holds what a reader sees without a kernel: markdown as text, each code cell's
HTML outputs (the components' `_repr_html_`, block maps), its PNG plots and its text. A
small inline script (no fetch: nothing can be downloaded here) counts on load what
rendered: images decoded (naturalWidth > 0) and tables laid out with a height, and writes
the counts into the DOM, which `--dump-dom` returns. `static_frame_problems` says where a
page without a kernel would show nothing at the end of a live view.
"""

from __future__ import annotations

import html
import pathlib
import re
import shutil
import subprocess
from typing import Any

_CHECK = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const tables = [...document.querySelectorAll('table')];
  const r = document.getElementById('render-check');
  r.dataset.images = imgs.length;
  r.dataset.imagesOk = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  r.dataset.tables = tables.length;
  r.dataset.tablesOk = tables.filter(t => t.getBoundingClientRect().height > 0).length;
  r.dataset.done = '1';
});
</script>"""


def chromium() -> str | None:
    """The Chromium binary (Debian's `chromium`), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _output_html(out: dict[str, Any]) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return f'<pre class="stream {out.get("name", "")}">{html.escape(out.get("text", ""))}</pre>'
    if kind == "error":
        return f'<pre class="error">{html.escape(out.get("ename", ""))}: {html.escape(out.get("evalue", ""))}</pre>'
    data = out.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:      # needs the widget JavaScript
        return '<div class="widget">(a live widget: it renders in Jupyter)</div>'
    if "image/png" in data:
        return f'<img class="plot" src="data:image/png;base64,{data["image/png"].strip()}">'
    if "text/html" in data:
        return f'<div class="html-output">{data["text/html"]}</div>'
    if "text/plain" in data:
        return f'<pre class="text">{html.escape(data["text/plain"])}</pre>'
    return ""


def notebook_html(nb: Any, title: str) -> str:
    """The executed notebook `nb` (nbformat) as one static HTML page."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             "<style>body{font:13px sans-serif;margin:12px;max-width:1400px}pre{background:#f6f8fa;"
             "padding:4px;white-space:pre-wrap}img{max-width:100%}.md{white-space:pre-wrap}</style>"
             f"</head><body><div id='render-check'></div>"]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(f'<div class="md">{html.escape(cell.source)}</div>')
        elif cell.cell_type == "code":
            parts.append(f'<pre class="source">{html.escape(cell.source)}</pre>')
            parts.extend(_output_html(o) for o in cell.get("outputs", []))
    parts.append(_CHECK + "</body></html>")
    return "".join(parts)


def render(page: pathlib.Path, screenshot: pathlib.Path, browser: str, width: int = 1280,
           height: int = 2400, timeout: float = 60) -> str:
    """Screenshot `page` to `screenshot` and return the DOM after load (with the counts)."""
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--allow-file-access-from-files", f"--window-size={width},{height}"]
    dom = subprocess.run(common + ["--virtual-time-budget=2000", "--dump-dom", f"--screenshot={screenshot}",
                                   page.as_uri()], check=True, capture_output=True, timeout=timeout, text=True)
    return dom.stdout                                # one launch: the DOM after load, and the picture


def ink_fraction(png: pathlib.Path) -> float:
    """Share of the screenshot's pixels that are not (near) white: 0 for a blank page."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))[..., :3]            # float [H, W, 3] in 0..1
    return float((img.min(axis=-1) < 0.9).mean())


_LIVE = re.compile(r"LiveView\(|live\s*=\s*True")
_SHOWS_WIDGET = re.compile(r"ipywidgets|interact\(|LiveView\(|live\s*=\s*True")     # by intent, not a progress bar
_WIDGET = "application/vnd.jupyter.widget-view+json"


def _is_static(data: dict[str, Any]) -> bool:
    """An output a page without a kernel shows: printed text, HTML or an image (not a widget's
    text/plain placeholder)."""
    return bool(data.get("stream")) or bool(data.keys() - {_WIDGET, "text/plain", "stream"})


def static_frame_problems(nb: Any) -> list[str]:
    """What a page without a kernel would miss: a live-view cell without its last frame (HTML)
    and its plot (PNG), or a cell that shows a widget (ipywidgets, interact, a live view) with
    no static output after the widget."""
    problems = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        outs = [o.get("data", {}) if "data" in o else {"stream": o.get("text", "")} for o in c.get("outputs", [])]
        if _LIVE.search(c.source):
            if not any('data-live="view"' in d.get("text/html", "") for d in outs):
                problems.append(f"cell {i}: a live view without its last frame as HTML")
            if not any("image/png" in d for d in outs):
                problems.append(f"cell {i}: a live view without its plot as an image")
        last_widget = max((j for j, d in enumerate(outs) if _WIDGET in d), default=None)
        if (_SHOWS_WIDGET.search(c.source) and last_widget is not None
                and not any(_is_static(d) for d in outs[last_widget + 1:])):
            problems.append(f"cell {i}: a widget with no static output after it")
    return problems
