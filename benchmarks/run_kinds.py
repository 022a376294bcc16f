"""Where a whole workload's GPU time goes, kind by kind, against the workload's floor.

One `generate` under torch.profiler (CUDA kernels and copies only); each kernel is put in a
kind by name (`benchmarks/roofline.py`), and the sums are set against the floor of the same
requests, kind by kind (`benchmarks/floor.py`: every op at max(bytes / copy bandwidth, FLOPs /
matmul peak)). Norm, rotary and activation are reported together as "small", as the floor
of a prefill step counts them. The profiler adds host time per launch, so the run's wall
time under it is not the benchmark's; the kernel times are the GPU's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import roofline

SMALL = ("norm", "rotary", "activation")
ORDER = ("gemm", "attention", "kv_write", "small", "other")


def group(kind: str) -> str:
    return "small" if kind in SMALL else kind


def profile_kinds(fn: Callable[[], Any], top: int = 12) -> dict:
    """GPU ms by kind of one call of fn, and its `top` costliest kernels [(name, launches, ms)]."""
    import torch
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds: dict[str, float] = dict.fromkeys(ORDER, 0.0)
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        ms = e.time_range.elapsed_us() / 1e3
        kinds[group(roofline.kind_of(e.name))] += ms
        k = kernels.setdefault(e.name[:80], [0, 0.0])
        k[0] += 1
        k[1] += ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return dict(kinds_ms=kinds, top=[(n, int(c), ms) for n, (c, ms) in ranked])


def table(measured_ms: dict[str, float], floor_s: dict[str, float], wall_s: float) -> str:
    """Markdown rows: kind, measured s, floor s, ratio, and the gap's share of the wall time."""
    floor = {k: 0.0 for k in ORDER}
    for k, v in floor_s.items():
        floor[group(k)] += v
    rows = ["| kind | GPU s | floor s | ratio | over the floor, s | of the wall |", "|---|---|---|---|---|---|"]
    tot_m = tot_f = 0.0
    for k in ORDER:
        m, f = measured_ms.get(k, 0.0) / 1e3, floor[k]
        tot_m, tot_f = tot_m + m, tot_f + f
        ratio = f"{m / f:.2f}x" if f > 0 else "-"
        rows.append(f"| {k} | {m:.3f} | {f:.3f} | {ratio} | {m - f:.3f} | {(m - f) / wall_s:.1%} |")
    rows.append(f"| **total** | **{tot_m:.3f}** | **{tot_f:.3f}** | **{tot_m / tot_f:.2f}x** | "
                f"{tot_m - tot_f:.3f} | {(tot_m - tot_f) / wall_s:.1%} |")
    rows.append(f"| wall (timed run) | {wall_s:.3f} | | | GPU idle {wall_s - tot_m:.3f} | "
                f"{(wall_s - tot_m) / wall_s:.1%} |")
    return "\n".join(rows)
