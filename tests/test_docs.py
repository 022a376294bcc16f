"""The README's and the docs' Python snippets run as written, each file's blocks in order in
one namespace; the docs link only to files inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [p for p in PAGES if FENCE.search(p.read_text())]


def _slow(page: Path) -> bool:
    """Pages that load the embedded model, build a server or profile the engine take over
    10 s on a 2-core CPU."""
    code = "\n".join(FENCE.findall(page.read_text()))
    return any(s in code for s in ("LLM()", "AsyncEngine", "profile_engine"))


@pytest.mark.parametrize("page", [pytest.param(p, id=str(p.relative_to(ROOT)),
                                               marks=[pytest.mark.slow] if _slow(p) else [])
                                  for p in WITH_CODE])
def test_the_pages_snippets_run(page: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # a snippet that writes files writes them here
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(FENCE.findall(page.read_text())):
        code = compile(block, f"{page.name}, python block {i + 1}", "exec")
        exec(code, namespace)  # noqa: S102  (running the page is the test)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_stay_inside_the_repository_and_exist(page: Path):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue                                  # http(s):, mailto:
        path = (page.parent / target).resolve()
        assert ROOT in path.parents or path == ROOT, f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} links to a missing file: {target}"


def test_the_configuration_page_lists_every_option_with_its_default():
    import dataclasses

    from toolkit.config import EngineConfig

    text = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    missing = [f.name for f in dataclasses.fields(EngineConfig)
               if f"| `{f.name}` | `{f.default!r}` |" not in text]
    assert not missing, f"docs/reference/configuration.md lacks (or has a stale default for): {missing}"


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("mkdocs", reason="the dev extra installs mkdocs-material")
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "guides" / "scheduling-policy" / "index.html").exists()
