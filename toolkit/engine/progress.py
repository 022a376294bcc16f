"""A progress bar that suits where it runs: tqdm.auto in notebooks, rich in terminals."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator


class _Null:
    def update(self, n: int = 1) -> None:
        pass


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and shell.get_ipython().__class__.__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool = True, desc: str = "") -> Iterator[object]:
    if not enabled or total < 2:
        yield _Null()
        return
    if _in_notebook():
        from tqdm.auto import tqdm

        with tqdm(total=total, desc=desc) as bar:
            yield bar
        return
    from rich.progress import Progress

    with Progress(transient=True) as p:
        task = p.add_task(desc, total=total)

        class _Bar:
            def update(self, n: int = 1) -> None:
                p.advance(task, n)

        yield _Bar()
