"""Benchmark records: the schema's validator, the summaries, the generated pages, the entry point."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from benchmarks.__main__ import listing
from benchmarks.catalog import CATALOG
from benchmarks.figures import extract
from benchmarks.record import figure, load_summaries, make_record, validate
from benchmarks.report import render


def _record() -> dict:
    return make_record("throughput", "python -m benchmarks throughput --num 4",
                       [figure("offline throughput", 200.0, "tok/s", peer="HF", peer_value=100.0)])


def test_a_made_record_is_valid_and_carries_machine_versions_and_date():
    rec = _record()
    assert rec["figures"][0]["ratio"] == 2.0
    assert rec["machine"]["gpu"] is None or isinstance(rec["machine"]["gpu"], str)
    assert rec["versions"]["torch"] and rec["date"][:2] == "20"


@pytest.mark.parametrize("breakage, field", [
    (lambda r: r.pop("machine"), "machine"),
    (lambda r: r.update(date="yesterday"), "date"),
    (lambda r: r["figures"][0].pop("unit"), "figures/0"),
    (lambda r: r["figures"][0].update(value="fast"), "figures/0/value"),
    (lambda r: r.update(schema="toolkit-benchmark-record/0"), "schema"),
    (lambda r: r["figures"][0].update(ratio=3.0), "ratio 3.0"),
    (lambda r: r["figures"][0].update(headline=True, ratio=None) or r["figures"][0].pop("ratio")
     or r["figures"][0].pop("peer_value"), "needs a ratio"),
])
def test_a_broken_record_is_refused_naming_the_field(breakage, field):
    rec = copy.deepcopy(_record())
    breakage(rec)
    with pytest.raises(ValueError, match=field):
        validate(rec)


def test_the_summaries_are_valid_and_every_headline_names_a_date_and_machine():
    records = load_summaries()
    heads = [(r, f) for r in records for f in r["figures"] if f.get("headline")]
    assert heads
    for rec, f in heads:
        assert rec["date"] and (rec["machine"]["gpu"] or rec["machine"]["cpu"]) and f.get("peer")


def test_results_page_and_readme_table_are_generated_from_the_summaries():
    for path, text in render(load_summaries()).items():
        assert path.read_text() == text, f"{path.name} is stale: run `python -m benchmarks report`"


def test_the_entry_point_lists_every_benchmark_and_each_has_a_main():
    text = listing()
    for name, bench in CATALOG.items():
        assert name in text
        spec = importlib.util.find_spec(f"benchmarks.{bench.module}")
        assert spec is not None and "def main(" in Path(spec.origin).read_text()


def test_figures_are_extracted_from_a_benchmarks_own_output():
    thr = {"workload": "random", "toolkit": {"all": {"tok_s": 900.0}}, "hf": {"tok_s": 30.0}}
    (f,) = extract("throughput", thr)
    assert f["ratio"] == 30.0 and f["peer_value"] == 30.0
    cpu = {"rows": [{"mode": "fixed", "prompts": 8, "toolkit_tok_s": 56.0, "hf_tok_s": 35.0}]}
    assert extract("cpu", cpu)[0]["ratio"] == 1.6
    serving = {"generate": {"output_tok_s": 100.0},
               "process": {"http": {"inf": {"output_tok_s": 96.0}}}}
    assert extract("serving", serving)[0]["ratio"] == 0.96
    attention = {"decode": [{"model": "m", "batch": 64, "ctx": 4096, "bytes": 1e9, "copy_bw": 4e12,
                             "toolkit_ms": 0.3, "toolkit_layers_ms": 0.25, "peers_ms": {"cudnn": 0.28},
                             "peers_layers_ms": {"cudnn": 0.2}}],
                 "prefill": [{"model": "m", "batch": 1, "seq": 4096, "toolkit_tflops": 450.0,
                              "peers_tflops": {"cudnn": 500.0, "flash": 260.0}}]}
    decode, prefill = extract("attention", attention)
    assert decode["value"] == 100.0 and decode["peer_value"] == 125.0 and decode["ratio"] == 0.8
    assert prefill["ratio"] == 0.9
    assert extract("attention", {"decode": []}) == []
    for f in extract("throughput", thr) + extract("cpu", cpu):
        validate(make_record("x", "cmd", [f]))


def test_keep_adds_a_run_to_its_machines_summary_without_raw_output(tmp_path):
    from benchmarks.record import keep

    rec = _record()
    rec["raw"] = {"rows": [1, 2, 3]}
    path = keep(rec, "tput", headline=["offline throughput"], folder=tmp_path)
    again = keep(rec, "tput", folder=tmp_path)                   # the same id replaces the old one
    assert path == again and path.parent == tmp_path
    (kept,) = load_summaries(tmp_path)
    assert kept["id"] == "tput" and "raw" not in kept and "headline" not in kept["figures"][0]
    with pytest.raises(ValueError, match="no figure named"):
        keep(rec, "x", headline=["latency"], folder=tmp_path)
