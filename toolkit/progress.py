"""A progress bar that suits where it runs: tqdm.auto in notebooks, rich in terminals."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator


class _Null:
    def update(self, n: int = 1) -> None:
        pass

    def set_queues(self, running: int, waiting: int) -> None:
        pass

    def set_info(self, text: str) -> None:
        pass


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (a ZMQ shell): widgets and inline plots show."""
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and shell.get_ipython().__class__.__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


class _Tqdm:
    """tqdm (notebook widget or text): tokens done / total, tokens/s, ETA, queues as postfix."""

    def __init__(self, bar) -> None:
        self.bar = bar

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_queues(self, running: int, waiting: int) -> None:
        self.set_info(f"running {running}, waiting {waiting}")

    def set_info(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=False)


class _Rich:
    def __init__(self, progress, task) -> None:
        self.progress, self.task = progress, task

    def update(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)

    def set_queues(self, running: int, waiting: int) -> None:
        self.set_info(f"running {running}, waiting {waiting}")

    def set_info(self, text: str) -> None:
        self.progress.update(self.task, queues=text)


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool = True, desc: str = "", unit: str = "it") -> Iterator[object]:
    """A bar with update(n), set_queues(running, waiting) and set_info(text) (the text after
    the bar): tqdm.auto in notebooks, rich
    in terminals; both show done / total, the rate in `unit`/s and the time left."""
    if not enabled or total < 2:
        yield _Null()
        return
    if in_notebook():
        from tqdm.auto import tqdm

        with tqdm(total=total, desc=desc, unit=unit) as bar:
            yield _Tqdm(bar)
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(unit), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
               TextColumn("{task.fields[queues]}"))
    with Progress(*columns, transient=True) as p:
        task = p.add_task(desc, total=total, queues="", rate="")
        bar = _Rich(p, task)
        update = bar.update

        def update_with_rate(n: int = 1) -> None:
            update(n)
            speed = p.tasks[0].speed
            p.update(task, rate=f"{speed:,.0f} {unit}/s" if speed else "")

        bar.update = update_with_rate      # type: ignore[method-assign]
        yield bar


class TokenProgress:
    """The generate progress bar, in tokens: each step advances it by the tokens it ran
    (prompt chunks included, so a long first prefill moves it); a finished request tops its
    share up (prompt + n x max_tokens; cache hits and early stops are never run). After the
    bar, vLLM's "est. speed input: ... toks/s, output: ... toks/s" (prompt tokens run, and
    tokens sampled, per second since the bar began) and the queues."""

    def __init__(self, engine, order: dict[str, int], params: list, enabled: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.engine = engine
        self.clock = clock
        self.start = clock()
        self.num_input = self.num_output = 0
        self.share = {}
        self.counted = dict.fromkeys(order, 0)
        self.owner = {}
        for rid, i in order.items():
            sp = params[i]
            seqs = engine.output_processor.sequence_ids(rid)
            for s in seqs:
                self.owner[s] = rid
            prompt = engine.output_processor.num_prompt_tokens(rid)
            self.share[rid] = prompt + sp.n * sp.max_tokens
        self.enabled = enabled
        self._bar_cm = progress_bar(total=sum(self.share.values()), enabled=enabled, desc="generate",
                                    unit="tok")

    def __enter__(self) -> "TokenProgress":
        self.bar = self._bar_cm.__enter__()
        if self.enabled:                  # no bar: no observer, no per-step record
            self.engine.add_observer(self._on_step)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.engine.remove_observer(self._on_step)
        self._bar_cm.__exit__(*exc)

    def _on_step(self, rec) -> None:
        n = 0
        for sid, k in rec.grants.items():
            rid = self.owner.get(sid)
            if rid is not None:
                k = min(k, self.share[rid] - self.counted[rid])
                self.counted[rid] += k
                n += k
        if n:
            self.bar.update(n)
        # a decode step samples a token a sequence (and its accepted drafts); a prompt's last
        # chunk samples one too, counted with the decodes of the next step's view: an estimate
        self.num_input += rec.num_prefill_tokens
        self.num_output += rec.num_decode_tokens - rec.num_draft_tokens + rec.num_accepted_tokens
        set_info = getattr(self.bar, "set_info", None)           # a user's bar may lack it
        if set_info is not None:
            set_info(self.info(rec.num_running, rec.num_waiting))
            return
        set_queues = getattr(self.bar, "set_queues", None)
        if set_queues is not None:
            set_queues(rec.num_running, rec.num_waiting)

    def info(self, running: int, waiting: int) -> str:
        """The text after the bar: estimated input / output speed, then the queues."""
        dt = max(self.clock() - self.start, 1e-9)
        return (f"est. speed input: {self.num_input / dt:,.0f} toks/s, output: {self.num_output / dt:,.0f} "
                f"toks/s; running {running}, waiting {waiting}")

    def finished(self, o) -> None:
        left = self.share[o.request_id] - self.counted[o.request_id]
        self.counted[o.request_id] = self.share[o.request_id]
        if left > 0:
            self.bar.update(left)
