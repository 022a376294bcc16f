"""LiveView: watch the engine while it runs, in Jupyter (ipywidgets).

    with LiveView(llm):                    # or: llm.generate(prompts, params, live=True)
        llm.generate(prompts, params)

While the engine steps, the view shows the step count, tokens/s, queue depths, KV usage,
a tokens-per-step timeline and the KV block map; when the block ends the widget is replaced
by its last frame as plain HTML (a page without a kernel, such as nbconvert's HTML or GitHub,
shows no widget, but shows that) and the whole recording is plotted (StepRecorder.plot). It is a step observer: nothing runs when none is attached.
Without ipywidgets the panes are replaced by a message saying how to get them, and the
plot is still drawn at the end; outside a Jupyter kernel nothing is shown, the run is only
recorded (`view.recorder`, `view.states`).
"""

from __future__ import annotations

import time
from typing import Any

from toolkit.notebook.recorder import StepRecorder, engine_of
from toolkit.notebook.render import render_all, render_blocks, render_status, render_timeline
from toolkit.notebook.state import LiveModel, LiveState


def widgets_available() -> tuple[bool, str]:
    """(True, "") when ipywidgets imports, else (False, the reason to show)."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError as e:
        return False, (f"the live view needs ipywidgets ({e}); `pip install ipywidgets` "
                       "(or the toolkit's `demo` extra) and restart the kernel")
    return True, ""


class LiveView:
    """A step observer that renders a LiveState into ipywidgets panes.

    interval: seconds between redraws (the model is updated every step; the block map is
    looked at only when a redraw is due). plot: draw the recording when the view closes.
    display: show the widget and the plot (None: when running in a Jupyter kernel; False
    records only: tests, scripts)."""

    def __init__(self, target: Any, *, interval: float = 0.1, window: int = 120, plot: bool = True,
                 display: bool | None = None) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        self.engine = engine_of(target)
        self.model = LiveModel(self.engine.allocator, window=window, scheduler=self.engine.scheduler)
        self.recorder = StepRecorder(self.engine)
        if display is None:
            from toolkit.progress import in_notebook

            display = in_notebook()
        self.interval, self.plot, self.display = interval, plot, display
        self.states: list[LiveState] = []      # each state that was drawn
        self.message = ""
        self.widget = None
        self._last_draw = float("-inf")
        self._panes: dict[str, Any] = {}
        self._handle: Any = None               # the shown widget's DisplayHandle (None: not in a kernel)

    # -- the observer --
    def __call__(self, rec) -> None:
        self.recorder(rec)
        due = time.perf_counter() - self._last_draw >= self.interval
        state = self.model.update(rec, look_at_blocks=due)
        if due:
            self._draw(state)

    def _draw(self, state: LiveState) -> None:
        self.states.append(state)
        self._last_draw = time.perf_counter()
        if self._panes:
            self._panes["status"].value = render_status(state)
            self._panes["timeline"].value = render_timeline(state)
            if state.block_cells is not None:
                self._panes["blocks"].value = render_blocks(state)

    # -- the widget --
    def _build(self) -> None:
        ok, self.message = widgets_available()
        if not ok:
            return
        import ipywidgets as w

        self._panes = {k: w.HTML() for k in ("status", "timeline", "blocks")}
        self.widget = w.VBox(list(self._panes.values()))

    def __enter__(self) -> "LiveView":
        self._build()
        if self.display:
            from IPython.display import display

            self._handle = display(self.widget if self.widget is not None else _Text(self.message),
                                   display_id=True)
        self.engine.add_observer(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.remove_observer(self)
        if self.model.state.step >= 0 and (not self.states or self.states[-1] is not self.model.state):
            self._draw(self.model.update_blocks())        # the last state, block map included
        if self._handle is not None and self.model.state.step >= 0:
            # the widget's output becomes the last frame as HTML: it stays in the saved notebook
            self._handle.update(LastFrame(self.model.state))
        if self.plot and self.display and len(self.recorder):
            self._show_plot()

    def _show_plot(self) -> None:
        import matplotlib.pyplot as plt

        from IPython.display import display

        # a cell output of its own, not a widget pane: it stays in the saved notebook's HTML
        fig = self.recorder.plot(title=f"the run: {len(self.recorder)} steps")
        display(fig)
        plt.close(fig)

    def _repr_html_(self) -> str:
        return render_all(self.model.state)


class LastFrame:
    """A LiveState frozen for display: the widget's panes as static HTML, a status line as text."""

    def __init__(self, state: LiveState) -> None:
        self.state = state

    def _repr_html_(self) -> str:
        return render_all(self.state)

    def __repr__(self) -> str:
        s = self.state
        return (f"LastFrame(step {s.step + 1}: {s.num_tokens} tokens, {s.tokens_per_s:.1f} tokens/s, "
                f"{s.num_finished} finished, {s.num_waiting} waiting, "
                f"KV {s.kv_blocks_used}/{s.kv_blocks_total} blocks)")


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
