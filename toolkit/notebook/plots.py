"""Matplotlib pictures of a step recording (StepRecorder.plot, the live view's last frame)."""

from __future__ import annotations

from typing import Any, Sequence

from toolkit.engine.observe import StepRecord


def plot_steps(records: Sequence[StepRecord], axes: Any = None, title: str | None = None) -> Any:
    """Tokens per step (prefill / decode stacked), queue depths and KV blocks, one panel each,
    against the step number. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    else:
        fig = axes[0].figure
    steps = [r.step for r in records]
    prefill = [r.num_prefill_tokens for r in records]
    decode = [r.num_decode_tokens for r in records]
    a, b, c = axes
    a.bar(steps, prefill, width=1.0, color="tab:orange", label="prefill")
    a.bar(steps, decode, width=1.0, bottom=prefill, color="tab:blue", label="decode")
    a.set(xlabel="step", ylabel="tokens", title="tokens per step")
    b.step(steps, [r.num_running for r in records], where="post", label="running")
    b.step(steps, [r.num_waiting for r in records], where="post", label="waiting")
    pre = [(r.step, r.num_preempted) for r in records if r.num_preempted]
    if pre:
        b.scatter(*zip(*pre), marker="x", color="tab:red", label="preempted", zorder=3)
    b.set(xlabel="step", ylabel="requests", title="queue depths")
    used, cached = [r.kv_blocks_used for r in records], [r.kv_blocks_cached for r in records]
    c.fill_between(steps, used, step="post", alpha=0.5, label="used")
    c.step(steps, cached, where="post", color="tab:green", label="cached")
    total = records[-1].kv_blocks_total if records else 0
    peak = max(used + cached, default=0)
    if total and total <= 4 * peak:      # the cache's size as a line where it fits the scale
        c.axhline(total, color="k", ls="--", lw=0.8, label="total")
        c.set(title="KV cache")
    else:                                # a cache far larger than the run: a line at its size
        c.set(title=f"KV cache (of {total:,} blocks)")   # would flatten used and cached to 0
        c.set_ylim(top=max(1.0, 1.15 * peak))
    c.set(xlabel="step", ylabel="KV blocks")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
