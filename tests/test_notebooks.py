"""Every notebook in notebooks/ runs top to bottom on the CPU and is kept with outputs cleared.

Its outputs are clean (no traceback, no warning on stderr, no chat-template token such as
<|im_end|> in printed text), and its static HTML (reprs, block maps, plots) renders in
headless Chromium: every image decodes, every table lays out, the screenshot is not blank.
Every live view leaves a static end state: a LiveView cell (or `live=True`) holds its last
frame as HTML and the recording as an image, and any widget still in an output is followed
by a static output (a widget shows nothing without a kernel).
The render check is skipped where Chromium is not installed (.ci/run installs Debian's).
"""

from __future__ import annotations

import html
import json
import os
import pathlib
import re

import pytest

from notebook_page import chromium, ink_fraction, notebook_html, render, static_frame_problems

NOTEBOOKS = sorted(pathlib.Path(__file__).resolve().parents[1].joinpath("notebooks").glob("*.ipynb"))

# HTML that must be in a notebook's page (a component's _repr_html_, a block map)
EXPECTED_HTML = {
    "01_blocks": ['title="block 0:'],
    "02_quickstart": ['data-toolkit="llm"', 'data-toolkit="scheduler"', 'data-live="timeline"'],
    "05_sampling": ['data-toolkit="sampler"'],
}
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")          # <|im_end|>, <|endoftext|>, ...
def _execute(path: pathlib.Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed with outputs; clear them"
    env_before = dict(os.environ)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return nb


def _texts(nb) -> list[tuple[str, str]]:
    """(kind, text) of every shown output: the stream's name, 'html' (unescaped) or 'result'."""
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append((o.get("name", ""), o.get("text", "")))
            elif "text/html" in o.get("data", {}):
                out.append(("html", html.unescape(o["data"]["text/html"])))
            elif "text/plain" in o.get("data", {}):
                out.append(("result", o["data"]["text/plain"]))
    return out


@pytest.mark.slow          # 3-52 s each on a 2-core CPU (a kernel start, the embedded model)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    nb = _execute(path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, json.dumps(errors)[:2000]
    texts = _texts(nb)
    warned = [t for kind, t in texts if kind == "stderr" and re.search("warning|deprecat", t, re.I)]
    assert not warned, f"{path.name} prints warnings: {warned[0][:500]}"
    special = [m for _, t in texts for m in _SPECIAL.findall(t)]
    assert not special, f"{path.name} prints chat-template tokens {special[:3]}"
    missing = static_frame_problems(nb)
    assert not missing, f"{path.name}: {missing}"
    page = notebook_html(nb, path.stem)
    for needle in EXPECTED_HTML.get(path.stem, []):
        assert needle in page, f"{path.name}'s page lacks {needle!r}"
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed: the render check is skipped (.ci/run installs it)")
    html_path, png = tmp_path / f"{path.stem}.html", tmp_path / f"{path.stem}.png"
    html_path.write_text(page, encoding="utf-8")
    dom = render(html_path, png, browser)
    check = re.search(r'<div id="render-check"([^>]*)>', dom)
    assert check and 'data-done="1"' in check.group(1), "the page's load check did not run"
    counts = dict(re.findall(r'data-([a-z-]+)="(\d+)"', check.group(1)))
    num_png = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert counts["images"] == str(num_png) and counts["images-ok"] == counts["images"], counts
    assert counts["tables-ok"] == counts["tables"], counts
    assert ink_fraction(png) > 0.02, f"{path.name}'s screenshot is blank"
