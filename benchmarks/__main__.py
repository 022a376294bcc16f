"""`python -m benchmarks`: list the benchmarks; `python -m benchmarks NAME [ARGS]` runs one
and writes its record (benchmarks/schema.json) to $OUT or benchmarks/results/ (not tracked);
`python -m benchmarks keep RECORD ID [--headline NAME ...]` adds a record to its machine's
summary; `python -m benchmarks report [--check]` renders RESULTS.md from benchmarks/summaries/."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.catalog import CATALOG


def listing() -> str:
    width = max(map(len, CATALOG))
    lines = ["usage: python -m benchmarks NAME [ARGS]   (ARGS: python -m benchmarks NAME --help)", ""]

    def row(b):
        return f"  {b.name:<{width}}  {b.what}{'' if b.gpu else '  [CPU]'}"

    lines += [row(b) for b in CATALOG.values() if not b.probe]
    lines += ["", "probes (diagnostics, each written to answer one question about the engine):"]
    lines += [row(b) for b in CATALOG.values() if b.probe]
    lines += ["", f"  {'keep':<{width}}  RECORD ID [--headline NAME ...]: a run's record into its machine's summary",
              f"  {'report':<{width}}  RESULTS.md and the README's table from benchmarks/summaries"]
    return "\n".join(lines)


class _Tee(io.StringIO):
    """Keeps what a benchmark prints (its raw output when it writes no JSON) and still shows it."""

    def __init__(self, echo: Any) -> None:
        super().__init__()
        self.echo = echo

    def write(self, text: str) -> int:
        self.echo.write(text)
        return super().write(text)


def run(name: str, argv: list[str]) -> Path:
    """Run one benchmark; its output becomes the `raw` of a record written next to it."""
    from benchmarks.figures import extract
    from benchmarks.record import make_record, write

    bench = CATALOG[name]
    mod = importlib.import_module(f"benchmarks.{bench.module}")
    folder = Path(os.environ.get("OUT", "benchmarks/results"))
    os.environ["OUT"] = str(folder)          # where a benchmark puts files beside its JSON (plots, raw times)
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = Path(tmp) / "raw.json"
        saved = sys.argv
        sys.argv = [f"python -m benchmarks {name}", *argv, *(["--out", str(raw_path)] if bench.writes_out else [])]
        printed = _Tee(sys.stdout)
        try:
            with contextlib.redirect_stdout(printed if not bench.writes_out else sys.stdout):
                mod.main()
        finally:
            sys.argv = saved
        raw = json.loads(raw_path.read_text()) if raw_path.exists() else None
        if not bench.writes_out:
            raw = {"stdout": printed.getvalue()}
    command = " ".join(["python -m benchmarks", name, *argv])
    return write(make_record(name, command, extract(name, raw), raw=raw), folder)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "report":
        from benchmarks.report import main as report

        return report(rest)
    if name == "keep":
        import argparse

        from benchmarks.record import keep

        ap = argparse.ArgumentParser(prog="python -m benchmarks keep")
        ap.add_argument("record", help="a record a run wrote (benchmarks/results/*.json)")
        ap.add_argument("id", help="the summary record's stable name")
        ap.add_argument("--headline", action="append", default=[], help="a figure the README quotes")
        a = ap.parse_args(rest)
        record = {"source": a.record, **json.loads(Path(a.record).read_text())}   # where its raw output lies
        print(f"kept in {keep(record, a.id, headline=a.headline)}; now `python -m benchmarks report`")
        return 0
    if name not in CATALOG:
        print(f"unknown benchmark {name!r}; valid: {', '.join(CATALOG)}, report", file=sys.stderr)
        return 2
    if "--help" in rest or "-h" in rest:
        sys.argv = [f"python -m benchmarks {name}", *rest]
        importlib.import_module(f"benchmarks.{CATALOG[name].module}").main()
        return 0
    print(f"record: {run(name, rest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
