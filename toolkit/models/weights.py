"""Iterate the tensors of a local Hugging Face checkpoint folder, one shard in memory at a time.

safetensors files are memory-mapped and read tensor by tensor; `.bin` files (only with
load_format="pt") are loaded with `torch.load(weights_only=True, mmap=True)`, one shard
at a time. A sharded checkpoint's index names its shards; a missing shard is an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
_FORMATS = {  # load_format -> (single-file name, index name, glob)
    "safetensors": ("model.safetensors", "model.safetensors.index.json", "*.safetensors"),
    "pt": ("pytorch_model.bin", "pytorch_model.bin.index.json", "*.bin"),
}


def resolve_format(folder: Path, load_format: str) -> str:
    """'safetensors' or 'pt' for a folder; "auto" means safetensors and never falls back to pickles."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if load_format != "auto":
        return load_format
    if any(folder.glob("*.safetensors")) or (folder / _FORMATS["safetensors"][1]).exists():
        return "safetensors"
    if any(folder.glob("*.bin")):
        raise ValueError(
            f"{folder} holds only .bin (pickle) weights; pass load_format='pt' to load them "
            "with torch.load(weights_only=True), or convert them to safetensors"
        )
    raise ValueError(
        f"no weights in {folder}: expected model.safetensors, a sharded "
        f"model.safetensors.index.json, or (with load_format='pt') pytorch_model.bin"
    )


def shard_files(folder: Path, fmt: str) -> list[Path]:
    """The weight files of a checkpoint, from its index when sharded; each must exist."""
    single, index, pattern = _FORMATS[fmt]
    if (folder / index).exists():
        weight_map = json.loads((folder / index).read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / single).exists():
        files = [folder / single]
    else:
        files = sorted(p for p in folder.glob(pattern) if p.is_file())
    missing = [p.name for p in files if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"checkpoint shards missing from {folder}: {missing} (listed in {index})"
        )
    if not files:
        raise FileNotFoundError(f"no {pattern} weight files in {folder}")
    return files


def iterate_weights(folder: Path, fmt: str, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) of every tensor of the checkpoint; at most one shard resident at a
    time. lazy (safetensors): a slice handle instead of the tensor, from which a loader reads
    only the rows or columns it keeps (a tensor-parallel rank's)."""
    for path in shard_files(folder, fmt):
        if fmt == "safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, (f.get_slice(name) if lazy else f.get_tensor(name))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from state.items()
            del state
