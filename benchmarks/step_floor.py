"""Where a workload's GPU time goes over its floor, by the size of the decode batch.

`run_kinds.py` sets a whole run's kernel time against the floor kind by kind; this splits the
same run into bands of steps, so a gap can be placed: the admission steps (prompts still
waiting), and the decode steps by how many sequences run (the tail of a long-output workload
is hundreds of steps of a few sequences, where fixed per-kernel costs dominate).

The engine is stepped by hand with one torch.profiler segment per run of steps in the same
band. A step's band is decided before it runs, from the last landed step's record: waiting
requests -> "admitting", else the running count. Each segment's kernels are set against the
floor of the steps it launched (`roofline.step_work` of each step's chunks, from the step
records' plans). The device is synchronized at each segment's end (a few times a run), so the
steps' overlap is broken there only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import roofline, run_kinds
from toolkit.notebook.recorder import StepRecorder

EDGES = (16, 64, 256)          # decode bands: 1-16, 17-64, 65-256, 257 and more


@dataclass
class Band:
    """One band's steps: GPU ms by kind (the profiler) and floor ms by kind (the plans)."""

    name: str
    steps: int = 0
    tokens: int = 0            # tokens run (prompt chunks and decode rows)
    gpu_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(run_kinds.ORDER, 0.0))
    floor_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(run_kinds.ORDER, 0.0))


def band_of(num_running: int, num_waiting: int, edges: Sequence[int] = EDGES) -> str:
    """The band of a step that follows a step that left num_running / num_waiting."""
    if num_waiting:
        return "admitting"
    lo = 1
    for hi in edges:
        if num_running <= hi:
            return f"decode {lo}-{hi}"
        lo = hi + 1
    return f"decode {lo}+"


def step_floor_ms(g: Any, plan: Any, copy_bw: float, matmul_flops: float) -> dict[str, float]:
    """Floor ms by kind (run_kinds' groups) of one step's plan (a SchedulerOutput)."""
    chunks = [(s.start, s.num_new_tokens) for s in plan.scheduled]
    sampled = sum(1 for s in plan.scheduled if s.samples)
    out = dict.fromkeys(run_kinds.ORDER, 0.0)
    for kind, ops in roofline.step_work(g, chunks, sampled).items():
        out[run_kinds.group(kind)] += roofline.floor_ms(ops, copy_bw, matmul_flops)
    return out


def profile_by_band(engine: Any, requests: Sequence[tuple[Any, Any]], g: Any, copy_bw: float,
                    matmul_flops: float, edges: Sequence[int] = EDGES,
                    profile: Callable[[Callable[[], Any]], dict] = run_kinds.profile_kinds) -> list[Band]:
    """Add `requests` [(prompt, SamplingParams)] to `engine`, step it to the end and return the
    bands in the order first seen. `profile(fn)` runs fn and returns {"kinds_ms": ...}."""
    recorder = StepRecorder(engine).attach()
    try:
        for prompt, params in requests:
            engine.add_request(prompt, params)
        bands: dict[str, Band] = {}
        launched: list[str] = []               # each step() call's band: it launches one step
        while engine.has_unfinished():
            last = recorder.records[-1] if recorder.records else None
            name = "admitting" if last is None else band_of(last.num_running, last.num_waiting, edges)
            band = bands.setdefault(name, Band(name))
            run = functools.partial(_steps_in_band, engine, recorder, last, name, edges, launched)
            for kind, ms in profile(run)["kinds_ms"].items():
                band.gpu_ms[kind] += ms
    finally:
        recorder.detach()
    if len(recorder.records) != len(launched):
        raise RuntimeError(f"{len(launched)} steps launched but {len(recorder.records)} landed")
    for rec, name in zip(recorder.records, launched):   # steps land in launch order
        band = bands[name]
        band.steps += 1
        band.tokens += rec.num_tokens
        for kind, ms in step_floor_ms(g, rec.scheduler_output, copy_bw, matmul_flops).items():
            band.floor_ms[kind] += ms
    return list(bands.values())


def _steps_in_band(engine: Any, recorder: StepRecorder, last: Any, name: str, edges: Sequence[int],
                   launched: list[str]) -> None:
    """Step `engine` while the last landed step's band is `name` (at least once)."""
    while engine.has_unfinished():
        now = recorder.records[-1] if recorder.records else None
        if now is not last and now is not None and band_of(now.num_running, now.num_waiting, edges) != name:
            return
        launched.append(name)
        engine.step()


def table(bands: list[Band]) -> str:
    """Markdown: per band, steps, GPU s against floor s for each kind and in all."""
    head = "| band | steps | tokens | " + " | ".join(f"{k} GPU / floor s" for k in run_kinds.ORDER) + \
        " | total GPU / floor s | ratio | over the floor, s |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for b in bands + [_sum(bands)]:
        g, f = sum(b.gpu_ms.values()) / 1e3, sum(b.floor_ms.values()) / 1e3
        cells = [f"{b.gpu_ms[k] / 1e3:.3f} / {b.floor_ms[k] / 1e3:.3f}" for k in run_kinds.ORDER]
        ratio = f"{g / f:.2f}x" if f > 0 else "-"
        rows.append(f"| {b.name} | {b.steps} | {b.tokens} | " + " | ".join(cells) +
                    f" | {g:.3f} / {f:.3f} | {ratio} | {g - f:.3f} |")
    return "\n".join(rows)


def _sum(bands: list[Band]) -> Band:
    total = Band("**all**")
    for b in bands:
        total.steps += b.steps
        total.tokens += b.tokens
        for k in run_kinds.ORDER:
            total.gpu_ms[k] += b.gpu_ms[k]
            total.floor_ms[k] += b.floor_ms[k]
    return total
