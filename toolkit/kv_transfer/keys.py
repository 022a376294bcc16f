"""Store keys that are stable across processes and name what the bytes mean.

A block's key is its prefix hash (blocks/hashing.py: BLAKE2b-128 over the parent hash and
the token ids' int64 bytes: the same in every process and on every run, unlike Python's
`hash`) in hex. The store's directory is the `namespace`: a BLAKE2b digest of the model's
identity and the KV layout (layers, block size, KV heads, head size, dtype), so blocks of
another model, of the same folder after its weights changed, or of another layout are
never read back. A model without a folder (random weights, an object built in memory) gets
a fresh random namespace: its blocks are reused within the engine, never after a restart.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".json")


def model_identity(folder: Any) -> str:
    """The folder's absolute path and the (name, size, mtime) of its weight and config files;
    None folder: a random identity."""
    if folder is None:
        return "anonymous-" + uuid.uuid4().hex
    root = Path(os.fsdecode(folder)).resolve()
    if not root.is_dir():
        return "file:" + str(root) + _stat(root)
    parts = [str(root)]
    for p in sorted(root.iterdir()):
        if p.suffix in WEIGHT_SUFFIXES and p.is_file():
            parts.append(p.name + _stat(p))
    return "\n".join(parts)


def _stat(p: Path) -> str:
    st = p.stat()
    return f":{st.st_size}:{st.st_mtime_ns}"


def namespace(identity: str, *, num_layers: int, block_size: int, num_kv_heads: int,
              head_dim: int, dtype: Any) -> str:
    """A directory name for blocks of this model and layout (32 hex digits)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(identity.encode())
    h.update(f"|L{num_layers}|bs{block_size}|H{num_kv_heads}|D{head_dim}|{dtype}".encode())
    return h.hexdigest()


def block_key(block_hash: int) -> str:
    return f"{block_hash:032x}"
