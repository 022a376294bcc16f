"""Which model class serves a checkpoint: keyed by its config's `architectures`.

The toolkit's own files are listed in `toolkit.registry.REGISTRY["model"]`. A user adds a
class without editing the toolkit, either in code:

    from toolkit.models import register_model
    register_model("MyForCausalLM", MyForCausalLM)          # or "my_pkg.model:MyForCausalLM"

or from an installed package, through the `toolkit.models` entry-point group (vLLM's plugin
design), whose entries are architecture names pointing at classes:

    [project.entry-points."toolkit.models"]
    MyForCausalLM = "my_pkg.model:MyForCausalLM"

A registered class is built as cls(config, dtype=, device=, group=, kernels=, eos_token_ids=)
and must meet the Model contract (toolkit/models/base.py).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from toolkit import registry

ENTRY_POINT_GROUP = "toolkit.models"


def register_model(architecture: str, cls: str | type) -> None:
    """Serve checkpoints whose config.architectures names `architecture` with `cls`."""
    if not isinstance(architecture, str) or not architecture:
        raise TypeError(f"architecture must be a non-empty string, got {architecture!r}")
    if not isinstance(cls, (str, type)):
        raise TypeError(f"cls must be a class or a 'module:Class' string, got {type(cls).__name__}")
    registry.register("model", architecture, cls)


def _plugins() -> dict[str, Any]:
    """Architecture -> entry point of the installed packages' `toolkit.models` group."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def supported_architectures() -> list[str]:
    return sorted(set(registry.REGISTRY.get("model", {})) | set(_plugins()))


def resolve(architectures: list[str]) -> type | None:
    """The class of the first architecture registered (code first, then entry points)."""
    table = registry.REGISTRY.get("model", {})
    plugins = None
    for arch in architectures:
        if arch in table:
            return registry.lookup("model", arch)
        plugins = _plugins() if plugins is None else plugins
        if arch in plugins:
            return plugins[arch].load()
    return None
