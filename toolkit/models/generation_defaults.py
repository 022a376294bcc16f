"""A model's sampling defaults from its `generation_config.json`, as vLLM's
`--generation-config` reads them.

    generation_defaults("auto", folder)     # {"temperature": 0.7, "top_p": 0.8, ...} or {}
    generation_defaults("vllm", folder)     # {}: SamplingParams' own defaults
    generation_defaults("path/to/dir", _)   # that folder's generation_config.json

Only the sampling fields a model card sets are taken (vLLM's list); `max_new_tokens` becomes
`max_tokens`. They are defaults: a request's own value always wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# generation_config.json key -> SamplingParams field
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
SOURCES = ("auto", "vllm", "a folder holding generation_config.json")


def generation_defaults(source: str, model_folder: str | os.PathLike | None) -> dict[str, Any]:
    """The SamplingParams defaults `source` names (module doc). A model given as a config or
    an object (no folder) has none under "auto"."""
    if not isinstance(source, str):
        raise TypeError(f"generation_config must be a string, one of {SOURCES}, got {source!r}")
    if source == "vllm":
        return {}
    if source == "auto":
        if model_folder is None:
            return {}
        folder = Path(model_folder)
        if not (folder / "generation_config.json").is_file():
            return {}
    else:
        folder = Path(source)
        if not (folder / "generation_config.json").is_file():
            raise ValueError(f"generation_config={source!r}: no generation_config.json in that folder; "
                             f"valid values: {SOURCES}")
    path = folder / "generation_config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable JSON file: {e}") from None
    out = {field: raw[key] for key, field in SAMPLING_KEYS.items() if raw.get(key) is not None}
    from toolkit.types import SamplingParams

    try:
        SamplingParams(**out)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path} sets a sampling default SamplingParams refuses: {e}; pass "
                         "generation_config='vllm' to ignore the file") from None
    return out
