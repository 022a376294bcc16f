"""Matplotlib plots of runs: latency distributions, the TTFT curve over time, a step timeline.

Each function takes RunResults (simulated or real), draws on the given axes (or new ones)
and returns the figure. matplotlib is imported when a plot is drawn, not before.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from toolkit.simulator.result import RunResult


def _axes(n: int, ax=None, width: float = 4.2, height: float = 3.2):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax[0].figure if isinstance(ax, (list, tuple, np.ndarray)) else ax.figure, np.atleast_1d(ax)
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0]


def plot_cdfs(runs: Sequence[RunResult], metrics: Sequence[str] = ("ttft", "tpot"), ax=None):
    """Empirical CDFs of per-request metrics (seconds, log x), one line per run."""
    fig, axes = _axes(len(metrics), ax)
    for a, m in zip(axes, metrics):
        for run in runs:
            v = np.sort(run.values(m))
            if len(v):
                a.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=run.label)
        a.set_xscale("log")
        a.set_xlabel(f"{m} (s)")
        a.set_ylabel("fraction of requests")
        a.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_over_time(runs: Sequence[RunResult], metric: str = "ttft", ax=None):
    """A per-request metric against its arrival time, one series per run (side by side:
    simulated against real)."""
    fig, axes = _axes(1, ax, width=6)
    a = axes[0]
    for run in runs:
        pts = sorted((r.arrival, getattr(r, metric)) for r in run.requests.values()
                     if getattr(r, metric) is not None)
        if pts:
            a.plot(*zip(*pts), ".-", ms=3, lw=0.8, label=run.label)
    a.set_xlabel("arrival (s)")
    a.set_ylabel(f"{metric} (s)")
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_timeline(run: RunResult, ax=None):
    """Per step: tokens (prefill / decode sequences), queue depths, KV usage."""
    fig, axes = _axes(3, ax)
    t = np.array([s.time for s in run.steps])
    axes[0].plot(t, [s.prefill_tokens for s in run.steps], lw=0.8, label="prefill tokens")
    axes[0].plot(t, [s.decode_seqs for s in run.steps], lw=0.8, label="decode seqs")
    axes[1].plot(t, [s.num_running for s in run.steps], lw=0.8, label="running")
    axes[1].plot(t, [s.num_waiting for s in run.steps], lw=0.8, label="waiting")
    axes[2].plot(t, [s.kv_usage for s in run.steps], lw=0.8, label="KV usage")
    pre = [s.time for s in run.steps if s.num_preempted]
    if pre:
        axes[2].plot(pre, [1.0] * len(pre), "rx", ms=4, label="preemption")
    for a, y in zip(axes, ("per step", "requests", "fraction")):
        a.set_xlabel("time (s)")
        a.set_ylabel(y)
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle(run.label, fontsize=9)
    fig.tight_layout()
    return fig


def plot_fairness(summaries: Sequence[dict], ax=None):
    """Jain's fairness index of each run (bars)."""
    fig, axes = _axes(1, ax, width=5)
    a = axes[0]
    a.bar([s["label"] for s in summaries], [s["jain_fairness"] for s in summaries])
    a.set_ylim(0, 1.05)
    a.set_ylabel("Jain's index (service / fair share)")
    a.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    return fig
