"""benchmarks/run_kinds.py: a whole run's kernel time by kind against the floor's kinds."""

from __future__ import annotations

from benchmarks import run_kinds


def test_norm_rotary_and_activation_count_as_small():
    assert [run_kinds.group(k) for k in ("norm", "rotary", "activation", "gemm", "other")] == \
        ["small", "small", "small", "gemm", "other"]


def test_table_sets_each_kind_against_its_floor():
    measured_ms = {"gemm": 1000.0, "attention": 3000.0, "kv_write": 0.0, "small": 300.0, "other": 200.0}
    # the floor's decode kinds (norm, rotary, activation) and a prefill's "small" fold together
    floor_s = {"gemm": 0.5, "attention": 2.5, "kv_write": 0.01, "norm": 0.05, "rotary": 0.02,
               "activation": 0.03, "small": 0.1, "other": 0.02}
    rows = run_kinds.table(measured_ms, floor_s, wall_s=5.0).splitlines()
    by_kind = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows[2:]}
    assert by_kind["gemm"][:3] == ["1.000", "0.500", "2.00x"]
    assert by_kind["small"][:3] == ["0.300", "0.200", "1.50x"]
    assert by_kind["kv_write"][2] == "0.00x"
    total = by_kind["**total**"]
    assert total[0] == "**4.500**" and total[1] == "**3.230**"          # sums of both columns
    assert by_kind["wall (timed run)"][3] == "GPU idle 0.500"
