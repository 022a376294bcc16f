"""The notebook render check can fail: a broken image is counted as not rendered, and a
blank screenshot has no ink."""

from __future__ import annotations

import base64
import io
import re
import types

import pytest
from notebook_page import chromium, ink_fraction, notebook_html, render


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
