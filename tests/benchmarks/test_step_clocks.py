"""benchmarks/step_clocks.py's parsing of nvidia-smi samples and its per-bin table (no GPU)."""

from __future__ import annotations

import datetime

from benchmarks.step_clocks import bins, read_smi


def test_read_smi_parses_samples_and_skips_bad_lines(tmp_path) -> None:
    path = tmp_path / "smi.csv"
    path.write_text("2026/12/02 11:00:00.100, 1980, 612.50, 55, 0x0000000000000004\n"
                    "2026/12/02 11:00:00.200, [N/A], 600, 55, 0x0\n"       # a field it cannot read
                    "garbage\n"
                    "2026/12/02 11:00:00.300, 1410, 699.9, 61, 0x0000000000000000\n")
    rows = read_smi(str(path))
    t0 = datetime.datetime(2026, 12, 2, 11, 0, 0, 100_000).timestamp()
    assert [r[1:] for r in rows] == [(1980.0, 612.5, 55.0, 4), (1410.0, 699.9, 61.0, 0)]
    assert abs(rows[0][0] - t0) < 1e-6 and abs(rows[1][0] - rows[0][0] - 0.2) < 1e-6
    assert read_smi(str(tmp_path / "missing.csv")) == []


def test_bins_group_steps_and_samples_by_time() -> None:
    rows = [dict(t=100.0 + 0.5 * i, phase="eager" if i < 4 else "decode", gpu=0.010 + 0.001 * i,
                 host=0.002, prefill=640 if i < 4 else 0, decodes=40) for i in range(8)]
    rows[5]["gpu"] = None                                   # a step without a GPU time
    smi = [(100.1, 1980.0, 500.0, 50.0, 0x4), (101.9, 1900.0, 520.0, 52.0, 0x1), (102.5, 1500.0, 700.0, 60.0, 0)]
    table = bins(rows, smi, 2.0)
    assert [b["phase"] for b in table] == ["eager", "decode"]
    assert [b["steps"] for b in table] == [4, 4]
    assert abs(table[0]["gpu_ms"] - 11.5) < 1e-9             # median of 10, 11, 12, 13 ms
    assert abs(table[1]["gpu_ms"] - 16.0) < 1e-9             # median of 14, 16, 17 (15 has none)
    assert table[0]["sm_mhz"] == 1940.0 and table[0]["reasons"] == "0x5"
    assert table[1]["temp_c"] == 60.0 and table[1]["reasons"] == "0x0"
    assert bins([], smi, 2.0) == []
