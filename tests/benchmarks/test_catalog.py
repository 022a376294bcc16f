"""The entry point covers the benchmarks folder: every script with a main() is a catalog entry
(or one of the few tools that are not benchmarks), run_gpu.sh goes through `python -m
benchmarks`, and a benchmark that writes no JSON has its printed output kept as the record's raw."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import benchmarks.__main__ as entry
from benchmarks.catalog import CATALOG, Benchmark

FOLDER = Path(entry.__file__).resolve().parent
NOT_BENCHMARKS = {"__main__", "report", "sharegpt_prep"}   # the entry point, the report, a data tool


def test_every_script_with_a_main_is_in_the_catalog():
    modules = {b.module for b in CATALOG.values()}
    scripts = {p.stem for p in FOLDER.glob("*.py") if "def main(" in p.read_text()}
    missing = sorted(scripts - modules - NOT_BENCHMARKS)
    assert not missing, f"scripts outside `python -m benchmarks` (add them to benchmarks/catalog.py): {missing}"
    for b in CATALOG.values():
        assert (FOLDER / f"{b.module}.py").exists(), b


def test_run_gpu_calls_only_the_entry_point_with_catalog_names():
    text = (FOLDER / "run_gpu.sh").read_text()
    assert not re.search(r"python3? (-m )?benchmarks[/.]\w+", text), "run_gpu.sh calls a script directly"
    names = re.findall(r"^\s*[\w|]+\)\s*bench \S+ \S+ \d+ (\w+)", text, re.MULTILINE)
    assert names, "no `bench` step found"
    assert not set(names) - set(CATALOG), set(names) - set(CATALOG)


def test_a_benchmark_that_prints_keeps_its_output_as_the_records_raw(tmp_path, monkeypatch, capsys):
    fake = types.ModuleType("benchmarks._printing")

    def main() -> None:
        assert "--out" not in sys.argv
        print("batch 1: 0.5 ms")

    fake.main = main
    monkeypatch.setitem(sys.modules, "benchmarks._printing", fake)
    monkeypatch.setitem(CATALOG, "printing", Benchmark("printing", "_printing", "prints", gpu=False,
                                                       probe=True, writes_out=False))
    monkeypatch.setenv("OUT", str(tmp_path))
    path = entry.run("printing", [])
    record = json.loads(path.read_text())
    assert record["raw"] == {"stdout": "batch 1: 0.5 ms\n"}
    assert record["benchmark"] == "printing" and record["figures"] == []
    assert "batch 1: 0.5 ms" in capsys.readouterr().out          # still shown while it runs
    assert "printing" in entry.listing().split("probes")[1]
