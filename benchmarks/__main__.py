"""`python -m benchmarks`: list the benchmarks; `python -m benchmarks NAME [ARGS]` runs one
and writes its record (benchmarks/schema.json) to $OUT or benchmarks/results/ (not tracked);
`python -m benchmarks report [--check]` renders RESULTS.md from benchmarks/summaries/."""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.catalog import CATALOG


def listing() -> str:
    width = max(map(len, CATALOG))
    lines = ["usage: python -m benchmarks NAME [ARGS]   (ARGS: python -m benchmarks NAME --help)", ""]
    lines += [f"  {b.name:<{width}}  {b.what}{'' if b.gpu else '  [CPU]'}" for b in CATALOG.values()]
    lines += ["", f"  {'report':<{width}}  RESULTS.md and the README's table from benchmarks/summaries"]
    return "\n".join(lines)


def run(name: str, argv: list[str]) -> Path:
    """Run one benchmark; its output becomes the `raw` of a record written next to it."""
    from benchmarks.figures import extract
    from benchmarks.record import make_record, write

    bench = CATALOG[name]
    mod = importlib.import_module(f"benchmarks.{bench.module}")
    folder = Path(os.environ.get("OUT", "benchmarks/results"))
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = Path(tmp) / "raw.json"
        saved = sys.argv
        sys.argv = [f"python -m benchmarks {name}", *argv, "--out", str(raw_path)]
        try:
            mod.main()
        finally:
            sys.argv = saved
        raw = json.loads(raw_path.read_text()) if raw_path.exists() else None
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
