"""Benchmark records: one JSON object per run, with the schema in benchmarks/schema.json.

    rec = make_record("throughput", "python -m benchmarks throughput --num 256",
                      [figure("output throughput", 21482, "tok/s", peer="HF", peer_value=604)])
    validate(rec)                       # ValueError naming the field, else None
    write(rec, "benchmarks/results")    # results/ is not tracked by git
    keep(rec, "throughput-nano-hf")     # into summaries/<machine>.json, which RESULTS.md renders

A summary file (benchmarks/summaries/<machine>.json) is a JSON list of records without
`raw`; benchmarks/report.py renders RESULTS.md and the README's table from them.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEMA_ID = "toolkit-benchmark-record/1"
SCHEMA_PATH = Path(__file__).with_name("schema.json")
SUMMARIES = Path(__file__).with_name("summaries")


def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def figure(name: str, value: float, unit: str, *, peer: str | None = None,
           peer_value: float | None = None, ratio: float | None = None, **extra: Any) -> dict:
    """One figure; the ratio is value / peer_value unless given."""
    f: dict[str, Any] = {"name": name, "value": value, "unit": unit}
    if peer is not None:
        f["peer"] = peer
    if peer_value is not None:
        f["peer_value"] = peer_value
        if ratio is None and peer_value:
            ratio = round(value / peer_value, 3)
    if ratio is not None:
        f["ratio"] = ratio
    f.update(extra)
    return f


def machine() -> dict:
    """The GPU (None on a CPU run), its count, the CPU and the threads torch uses."""
    import torch

    cuda = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if cuda else None,
            "gpu_count": torch.cuda.device_count() if cuda else 0,
            "cpu": platform.processor() or platform.machine(),
            "cpu_threads": torch.get_num_threads()}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True, check=False,
                             cwd=Path(__file__).parent, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def versions() -> dict:
    import torch

    import toolkit

    got: dict[str, str | None] = {"torch": torch.__version__,
                                  "toolkit": _git_commit() or toolkit.__version__}
    for name in ("triton", "transformers"):
        try:
            got[name] = __import__(name).__version__
        except ImportError:
            got[name] = None
    return got


def make_record(benchmark: str, command: str, figures: list[dict], *, raw: Any = None,
                notes: str | None = None) -> dict:
    rec: dict[str, Any] = {"schema": SCHEMA_ID, "benchmark": benchmark,
                           "date": time.strftime("%Y-%m-%d"), "machine": machine(),
                           "versions": versions(), "command": command, "figures": figures}
    if notes:
        rec["notes"] = notes
    if raw is not None:
        rec["raw"] = raw
    validate(rec)
    return rec


def validate(record: Any) -> None:
    """Raise ValueError naming the first field that breaks the schema, or a figure whose
    ratio contradicts its value and peer_value."""
    import jsonschema

    try:
        jsonschema.validate(record, schema())
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(the record)"
        raise ValueError(f"benchmark record: {where}: {e.message}") from None
    for i, f in enumerate(record["figures"]):
        if "ratio" in f and f.get("peer_value"):
            implied = f["value"] / f["peer_value"]
            if abs(implied - f["ratio"]) > 0.011 * max(1.0, abs(f["ratio"])):
                raise ValueError(f"benchmark record: figures/{i} ({f['name']!r}): ratio {f['ratio']} "
                                 f"but value / peer_value = {implied:.3f}")
        if f.get("headline") and "ratio" not in f and "ratio_range" not in f:
            raise ValueError(f"benchmark record: figures/{i} ({f['name']!r}): a headline figure "
                             "needs a ratio against its peer")


def write(record: dict, folder: str | os.PathLike) -> Path:
    validate(record)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gpu = (record["machine"]["gpu"] or "cpu").lower().replace(" ", "-")
    path = folder / f"{record['benchmark']}_{record['date']}_{gpu}_{time.strftime('%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


def summary_file(record: dict, folder: str | os.PathLike = SUMMARIES) -> Path:
    """The machine's summary file: summaries/<gpu name>.json, or cpu-<cpu>.json."""
    m = record["machine"]
    name = m["gpu"] or f"cpu-{m['cpu']}"
    return Path(folder) / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".json")


def keep(record: dict, record_id: str, *, headline: Sequence[str] = (),
         folder: str | os.PathLike = SUMMARIES) -> Path:
    """Add a run's record to its machine's summary file, without its raw output, as
    `record_id` (replacing an older record of that id); `headline` names the figures the
    README quotes. Returns the summary file."""
    rec = {k: v for k, v in record.items() if k != "raw"}
    rec["id"] = record_id
    names = {f["name"] for f in rec["figures"]}
    unknown = sorted(set(headline) - names)
    if unknown:
        raise ValueError(f"no figure named {unknown}; the record's figures: {sorted(names)}")
    rec["figures"] = [{**f, "headline": True} if f["name"] in headline else f for f in rec["figures"]]
    validate(rec)
    path = summary_file(rec, folder)
    records = json.loads(path.read_text()) if path.exists() else []
    records = [r for r in records if r.get("id") != record_id] + [rec]
    path.write_text(json.dumps(records, indent=1) + "\n")
    return path


def load_summaries(folder: str | os.PathLike = SUMMARIES) -> list[dict]:
    """Every record of every summary file, validated; ids unique."""
    records, seen = [], set()
    for path in sorted(Path(folder).glob("*.json")):
        for rec in json.loads(path.read_text()):
            try:
                validate(rec)
            except ValueError as e:
                raise ValueError(f"{path.name}: {e}") from None
            if "raw" in rec:
                raise ValueError(f"{path.name}: {rec.get('id')}: a summary record keeps no raw output")
            if rec.get("id") in seen or "id" not in rec:
                raise ValueError(f"{path.name}: record id missing or repeated: {rec.get('id')!r}")
            seen.add(rec["id"])
            records.append(rec)
    return records
