"""LoRAModules: the adapters a server serves, by the name a request's `model` gives.

    --lora-modules sql=/adapters/sql chat=/adapters/chat     at start (parse_lora_modules)
    POST /v1/load_lora_adapter {"lora_name", "lora_path"}    at run time, behind a flag
    POST /v1/unload_lora_adapter {"lora_name"}

Each name gets a fresh LoRARequest id (never reused, so a name loaded again from another
folder never meets the old weights in the engine's caches). Loading reads the folder here
(its adapter_config.json and its weights: a corrupt or malformed adapter is refused at once);
the engine checks the weights against the model and max_lora_rank when a request first uses
it (a 400 naming what is wrong). Unloading removes the name: running requests finish with it.
"""

from __future__ import annotations

import itertools
import threading
from typing import Iterable, Mapping

from toolkit.lora.peft import read_adapter
from toolkit.lora.request import LoRARequest


def parse_lora_modules(items: Iterable[str]) -> dict[str, str]:
    """["name=path", ...] (vLLM's --lora-modules) -> {name: path}; ValueError on a bad item."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules takes name=path items, got {item!r}")
        out[name.strip()] = path.strip()
    return out


class LoRAModules:
    def __init__(self, base_name: str, modules: Mapping[str, str] | None = None) -> None:
        self.base_name = base_name
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._by_name: dict[str, LoRARequest] = {}
        for name, path in (modules or {}).items():
            self.load(name, path)

    def load(self, name: str, path: str) -> LoRARequest:
        """Serve the adapter at `path` as `name`; ValueError for a taken name or a folder that
        is not a PEFT LoRA."""
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError("loading a LoRA adapter needs a non-empty lora_name and lora_path")
        if name == self.base_name:
            raise ValueError(f"{name!r} is the base model's name; give the adapter another one")
        read_adapter(path, 0, name, max_rank=1 << 30)     # readable and a LoRA (rank: the engine's)
        with self._lock:
            if name in self._by_name:
                raise ValueError(f"The lora adapter '{name}' has already been loaded; unload it first")
            req = LoRARequest(name, next(self._ids), path)
            self._by_name[name] = req
        return req

    def unload(self, name: str) -> LoRARequest:
        with self._lock:
            req = self._by_name.pop(name, None)
        if req is None:
            raise KeyError(f"The lora adapter '{name}' cannot be found")
        return req

    def get(self, name: str | None) -> LoRARequest | None:
        return self._by_name.get(name) if name is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def items(self) -> list[tuple[str, LoRARequest]]:
        return list(self._by_name.items())

    def __repr__(self) -> str:
        return f"LoRAModules({ {n: r.lora_path for n, r in self._by_name.items()} })"
