"""Where the running notebook lives, so it can read files beside it whatever the kernel's
current directory is (Jupyter starts kernels in the notebook's folder; VS Code, papermill
or `jupyter execute` from elsewhere may not)."""

from __future__ import annotations

import os
import pathlib
import sys


def notebook_dir(fallback: str = "notebooks") -> pathlib.Path:
    """The folder of the running notebook: what the front end reports (Jupyter server's
    JPY_SESSION_NAME, VS Code's __vsc_ipynb_file__), else the source checkout's `fallback`
    folder beside the toolkit package (an editable install), else the current directory."""
    candidates = []
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        candidates.append(pathlib.Path(session))
    main = sys.modules.get("__main__")
    vsc = getattr(main, "__vsc_ipynb_file__", None)
    if vsc:
        candidates.append(pathlib.Path(vsc))
    for c in candidates:
        if c.suffix == ".ipynb" and c.parent.is_dir():
            return c.parent.resolve()
    here = pathlib.Path(__file__).resolve().parents[2] / fallback   # <checkout>/notebooks
    if here.is_dir():
        return here
    return pathlib.Path.cwd()
