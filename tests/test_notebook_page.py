"""The notebook render check can fail: a broken image is counted as not rendered, a blank
screenshot has no ink, and a live view or widget without a static end state is named."""

from __future__ import annotations

import base64
import io
import re
import types

import pytest
from notebook_page import chromium, ink_fraction, notebook_html, render, static_frame_problems


def _png(color: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(2, 1), facecolor=color)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor=color)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def test_a_broken_image_and_a_blank_page_are_caught(tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    cell = types.SimpleNamespace(cell_type="code", source="x", get=lambda k, d=None: [
        {"output_type": "display_data", "data": {"image/png": _png("black")}},
        {"output_type": "display_data", "data": {"image/png": "bm90IGEgcG5n"}},       # "not a png"
        {"output_type": "display_data", "data": {"text/html": "<table><tr><td>1</td></tr></table>"}},
    ])
    page = tmp_path / "p.html"
    page.write_text(notebook_html(types.SimpleNamespace(cells=[cell]), "p"))
    dom = render(page, tmp_path / "p.png", browser, width=400, height=300)
    counts = dict(re.findall(r'data-([a-z-]+)="(\d+)"', re.search(r'id="render-check"([^>]*)>', dom).group(1)))
    assert (counts["images"], counts["images-ok"], counts["tables-ok"]) == ("2", "1", "1"), counts
    assert ink_fraction(tmp_path / "p.png") > 0.02
    blank = tmp_path / "blank.png"
    blank.write_bytes(base64.b64decode(_png("white")))
    assert ink_fraction(blank) < 0.001


def _cell(source: str, outputs: list[dict]) -> types.SimpleNamespace:
    return types.SimpleNamespace(cell_type="code", source=source, get=lambda k, d=None: outputs)


def test_a_live_view_or_widget_without_a_static_end_state_is_named():
    widget = {"output_type": "display_data", "data": {
        "application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "VBox(...)"}}
    frame = {"output_type": "display_data", "data": {"text/html": '<div data-live="view">..</div>'}}
    plot = {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}}
    printed = {"output_type": "stream", "name": "stdout", "text": "load 0.50 ...\n"}
    nb = types.SimpleNamespace(cells=[
        _cell("with LiveView(llm):\n    llm.generate(p)", [widget]),                # the widget only
        _cell("llm.generate(p, live=True)", [frame, plot]),                         # frame + plot
        _cell("interact(f, load=FloatSlider())", [widget, printed]),                # text after it
        _cell("interact(f, load=FloatSlider())", [printed, widget]),                # nothing after
        _cell("with LiveView(llm):\n    llm.generate(p)", [frame]),                 # no plot
        _cell("llm.generate(p)", [widget]),                   # a progress bar: not a view by intent
    ])
    assert static_frame_problems(nb) == [
        "cell 0: a live view without its last frame as HTML",
        "cell 0: a live view without its plot as an image",
        "cell 0: a widget with no static output after it",
        "cell 3: a widget with no static output after it",
        "cell 4: a live view without its plot as an image",
    ]
