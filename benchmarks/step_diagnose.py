"""Where a whole `generate`'s wall time goes, step by step (what a steady-decode benchmark hides).

A steady decode at one batch size can overlap the host with the GPU while a real workload
(requests finishing, contexts growing, batch sizes moving through CUDA-graph buckets) does
not. `diagnose(llm, prompts, params)` runs one generate with:

- every engine step timed, and inside it the host's wait for the GPU (the event wait in
  `Launched.result`) and the host parts (schedule, prepare, plan, update, outputs...);
- steps grouped by what they ran (prefill or not, batch size band), wall and wait per group;
- torch's sync debug mode: each call that made the host wait for the GPU outside the
  event wait, counted by where it was called from (file:line);
- (CUDA) the CUDA runtime calls that took the host longest, from torch.profiler.

    from benchmarks.step_diagnose import diagnose
    report = diagnose(llm, prompts, params)       # a dict; print_report(report) for a table
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
import warnings
from typing import Any

import torch


@contextlib.contextmanager
def timed_method(obj: Any, name: str, spent: dict[str, float], key: str | None = None):
    """obj.name timed into spent[key or name] while the block runs. On an instance the timer
    is an instance attribute, removed after; on a class (every instance's calls) the class's
    own function is put back after."""
    f = getattr(obj, name)
    key = key or name
    own = isinstance(obj, type) and name in vars(obj)

    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t
    setattr(obj, name, g)
    try:
        yield
    finally:
        if own:
            setattr(obj, name, f)
        else:
            delattr(obj, name)


def _band(b: int) -> str:
    for hi in (8, 32, 64, 128, 192, 256):
        if b <= hi:
            return f"<={hi}"
    return ">256"


def diagnose(llm, prompts: list, params: list, *, sync_debug: bool = True,
             runtime_calls: bool = True) -> dict:
    """Run llm.generate(prompts, params) instrumented; the report as a dict (see module doc)."""
    from toolkit.worker import inflight

    eng = llm.engine
    cuda = torch.cuda.is_available() and eng.runner.device.type == "cuda"
    spent: dict[str, float] = collections.defaultdict(float)
    steps: list[tuple[float, float, str]] = []      # (wall s, event wait s, what it scheduled)
    planned: list[str] = []
    plain_result = inflight.Launched.result

    def result(self):
        if self.result_now is None and self._event is not None:
            t = time.perf_counter()
            self._event.synchronize()
            spent["event_wait"] += time.perf_counter() - t
        return plain_result(self)

    eng_step, schedule = eng.step, eng.scheduler.schedule

    by_band: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))

    def step():
        before, t = dict(spent), time.perf_counter()
        out = eng_step()
        key = planned[-1] if planned else "none"
        steps.append((time.perf_counter() - t, spent["event_wait"] - before.get("event_wait", 0.0), key))
        for k, v in spent.items():           # each part's time in this step, by what it ran
            by_band[key][k] += v - before.get(k, 0.0)
        return out

    def planning():
        t = time.perf_counter()
        out = schedule()
        spent["schedule"] += time.perf_counter() - t
        prefill = sum(s.num_new_tokens for s in out.scheduled
                      if s.num_new_tokens != 1 + s.num_spec_tokens or s.start < s.request.num_prompt_tokens)
        planned.append("prefill" if prefill else f"decode {_band(len(out.scheduled))}")
        return out

    parts = [(eng.scheduler, "update"),
             (eng.scheduler, "resolve_placeholders"), (eng.runner, "prepare"), (eng.runner, "_batch"),
             (eng.runner.attention, "plan"), (eng.runner, "forward"), (eng.runner, "_sample_plain"),
             (eng.runner, "_metadata"), (eng.runner.model, "compute_logits"),
             (eng.output_processor, "process"), (eng, "_retire")]
    if eng.runner.graphs is not None:
        parts += [(eng.runner.graphs, "replay"), (eng.runner.attention, "use_static")]
    parts = [(o, n) for o, n in parts if hasattr(o, n)]
    caught: list[warnings.WarningMessage] = []
    with contextlib.ExitStack() as stack:
        for obj, name in parts:
            stack.enter_context(timed_method(obj, name, spent))
        eng.step, eng.scheduler.schedule = step, planning
        stack.callback(lambda: [vars(o).pop(n) for o, n in ((eng, "step"), (eng.scheduler, "schedule"))])
        inflight.Launched.result = result
        stack.callback(lambda: setattr(inflight.Launched, "result", plain_result))
        if sync_debug and cuda:
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(lambda: torch.cuda.set_sync_debug_mode(0))
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t

    # each call grouped by what it scheduled (and launched)
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for dt, wait, key in steps:
        g = groups[key]
        g[0] += 1
        g[1] += dt
        g[2] += wait
    where = collections.Counter(f"{w.filename.rsplit('/', 2)[-1]}:{w.lineno}" for w in caught
                                if "prototype" not in str(w.message))
    report = dict(
        wall_s=wall, steps=len(steps), step_wall_s=sum(s[0] for s in steps),
        event_wait_s=spent.pop("event_wait", 0.0),
        parts_ms_per_step={k: v / max(len(steps), 1) * 1e3 for k, v in sorted(spent.items(), key=lambda kv: -kv[1])},
        groups={k: dict(steps=g[0], wall_ms_per_step=g[1] / g[0] * 1e3, wait_ms_per_step=g[2] / g[0] * 1e3,
                        parts_ms_per_step={p: v / g[0] * 1e3 for p, v in sorted(
                            by_band[k].items(), key=lambda kv: -kv[1]) if p != "event_wait"})
                for k, g in sorted(groups.items())},
        host_syncs=dict(where.most_common(12)),
    )
    if runtime_calls and cuda:
        report["runtime_calls"] = _runtime_calls(lambda: llm.generate(prompts, params, use_tqdm=False))
    return report


def _runtime_calls(fn, top: int = 12) -> dict[str, dict]:
    """{CUDA runtime/driver call: count, total ms, max ms} over fn(), the costliest first."""
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in prof.events():
        if e.device_type == DeviceType.CPU and e.name.startswith("cu"):
            us = e.time_range.elapsed_us()
            c = calls[e.name]
            c[0] += 1
            c[1] += us / 1e3
            c[2] = max(c[2], us / 1e3)
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]
    return {k: dict(count=int(c[0]), total_ms=round(c[1], 2), max_ms=round(c[2], 3)) for k, c in ranked}


def print_report(r: dict, tag: str = "") -> None:
    print(f"{tag}generate {r['wall_s']:.2f} s over {r['steps']} steps (steps' wall {r['step_wall_s']:.2f} s, "
          f"host waiting on step events {r['event_wait_s']:.2f} s)")
    print(f"{tag}  host parts, ms a step: " + ", ".join(f"{k} {v:.2f}" for k, v in r["parts_ms_per_step"].items()))
    for k, g in r["groups"].items():
        print(f"{tag}  {k:14s} {g['steps']:5d} steps  wall {g['wall_ms_per_step']:6.2f} ms  "
              f"event wait {g['wait_ms_per_step']:6.2f} ms")
        if g.get("parts_ms_per_step"):
            print(f"{tag}      " + ", ".join(f"{p} {v:.2f}" for p, v in g["parts_ms_per_step"].items()))
    print(f"{tag}  host syncs by caller: {r['host_syncs'] or 'none'}")
    for k, c in r.get("runtime_calls", {}).items():
        print(f"{tag}  {k:32s} x{c['count']:6d}  {c['total_ms']:9.2f} ms  max {c['max_ms']:.3f} ms")

