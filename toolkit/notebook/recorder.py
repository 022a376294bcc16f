"""StepRecorder: the engine's step records collected into a table, and plotted.

    with StepRecorder(llm) as rec:          # attaches a step observer; detaches on exit
        llm.generate(prompts, params)
    rec.table()                             # one row per step (a pandas DataFrame if installed)
    rec.plot()                              # tokens per step, queue depths, KV blocks over time

An LLM or its Engine is accepted; `attach` / `detach` do the same without a `with`.
"""

from __future__ import annotations

from typing import Any

from toolkit.engine.observe import StepRecord

COLUMNS = ("step", "time", "duration", "num_prefill_tokens", "num_decode_tokens", "num_draft_tokens",
           "num_accepted_tokens", "num_running", "num_waiting", "num_preempted", "num_finished",
           "kv_blocks_used", "kv_blocks_cached", "kv_blocks_total", "num_scheduled")


def engine_of(target: Any) -> Any:
    """The Engine of an LLM, or the engine itself (anything with add_observer)."""
    engine = getattr(target, "engine", target)
    if engine is None:
        raise RuntimeError("this LLM is closed; record a live one")
    if not callable(getattr(engine, "add_observer", None)):
        raise TypeError(f"expected an LLM or an Engine (with add_observer), got {type(target).__name__}")
    return engine


class StepRecorder:
    """Collects a StepRecord per engine step (a step observer)."""

    def __init__(self, target: Any = None) -> None:
        self.records: list[StepRecord] = []
        self._engine = None if target is None else engine_of(target)

    def __call__(self, record: StepRecord) -> None:
        self.records.append(record)

    def attach(self, target: Any = None) -> "StepRecorder":
        engine = self._engine if target is None else engine_of(target)
        if engine is None:
            raise ValueError("attach needs an LLM or an Engine (none was given to StepRecorder)")
        self._engine = engine
        if self not in engine.observers:
            engine.add_observer(self)
        return self

    def detach(self) -> None:
        if self._engine is not None and self in self._engine.observers:
            self._engine.remove_observer(self)

    def __enter__(self) -> "StepRecorder":
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def clear(self) -> None:
        self.records.clear()

    def __len__(self) -> int:
        return len(self.records)

    # -- the table --
    def rows(self) -> list[dict[str, Any]]:
        """One dict per step: the record's counts, `time` (seconds since the first step began)
        and `num_scheduled` (sequences granted tokens). Grants per sequence stay in
        `records[i].grants`."""
        t0 = self.records[0].start_time if self.records else 0.0
        out = []
        for r in self.records:                  # not dataclasses.asdict: it would copy the plan
            row = {k: getattr(r, k) for k in COLUMNS if k not in ("time", "num_scheduled")}
            row["time"] = r.start_time - t0 + r.duration
            row["num_scheduled"] = len(r.grants)
            out.append({k: row[k] for k in COLUMNS})
        return out

    def table(self) -> Any:
        """A pandas DataFrame of `rows()` indexed by step, or the list of rows without pandas."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows()
        return pd.DataFrame(self.rows(), columns=list(COLUMNS)).set_index("step")

    def summary(self) -> dict[str, float]:
        """Totals: steps, prefill / decode tokens, preemptions, wall seconds, tokens per second,
        peak KV blocks used."""
        recs = self.records
        wall = sum(r.duration for r in recs)
        tokens = sum(r.num_tokens for r in recs)
        return dict(steps=len(recs), prefill_tokens=sum(r.num_prefill_tokens for r in recs),
                    decode_tokens=sum(r.num_decode_tokens for r in recs),
                    preemptions=sum(r.num_preempted for r in recs), wall_s=wall,
                    tokens_per_s=tokens / wall if wall > 0 else 0.0,
                    peak_kv_blocks=max((r.kv_blocks_used for r in recs), default=0))

    # -- the picture --
    def plot(self, axes: Any = None, title: str | None = None) -> Any:
        """Three panels against the step: tokens per step (prefill and decode, stacked), queue
        depths (running, waiting, preempted), KV blocks (used, cached, total). Returns the
        matplotlib Figure; `axes` may be three Axes to draw into."""
        from toolkit.notebook.plots import plot_steps

        return plot_steps(self.records, axes=axes, title=title)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"StepRecorder({s['steps']} steps, {s['prefill_tokens']} prefill + {s['decode_tokens']} "
                f"decode tokens, {s['tokens_per_s']:.0f} tokens/s)")

    def _repr_html_(self) -> str:
        from toolkit.display import html_table

        s = self.summary()
        return html_table("StepRecorder", {k: (f"{v:.3g}" if isinstance(v, float) else v)
                                            for k, v in s.items()})
