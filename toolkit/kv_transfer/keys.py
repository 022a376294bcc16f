"""Store keys that are stable across processes and name what the bytes mean.

A block's key is its prefix hash (blocks/hashing.py: BLAKE2b-128 over the parent hash and
the token ids' int64 bytes: the same in every process and on every run, unlike Python's
`hash`) in hex. The store's directory is the `namespace`: a BLAKE2b digest of the model's
identity and the KV layout (layers, block size, KV heads, head size, dtype; an fp8 cache's
per-layer K / V scales, as a digest: a stored byte means stored value x scale, so blocks
written under other scales would decode to other K / V; under tensor parallelism the TP
size and the rank, whose slice of the KV heads the block holds), so blocks of another
model, of the same folder after its weights changed, or of another layout are never read
back. A model without a folder (random weights, an object built in memory) gets
a fresh random namespace: its blocks are reused within the engine, never after a restart.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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


def scales_digest(k_scales: Sequence[float], v_scales: Sequence[float]) -> str:
    """A digest of an fp8 cache's per-layer scales (float32 values, as the kernels use them)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray([*k_scales, *v_scales], dtype=np.float32).tobytes())
    return h.hexdigest()


def kv_format(kv_cache: Any, tp_rank: int = 0, tp_size: int = 1) -> str:
    """What makes two engines' blocks interchangeable besides the model: the layout of one
    rank's block, its dtype, an fp8 cache's scales and the rank's place in the TP group."""
    fmt = (f"L{kv_cache.num_layers}|bs{kv_cache.block_size}|H{kv_cache.num_kv_heads}|"
           f"D{kv_cache.head_dim}|{kv_cache.dtype}")
    if kv_cache.is_fp8:
        fmt += "|scales:" + scales_digest(kv_cache.k_scales, kv_cache.v_scales)
    if tp_size > 1:
        fmt += f"|tp{tp_size}|rank{tp_rank}"
    return fmt


def namespace(identity: str, *, num_layers: int, block_size: int, num_kv_heads: int,
              head_dim: int, dtype: Any, scales: str | None = None, tp_size: int = 1) -> str:
    """A directory name for blocks of this model and layout (32 hex digits); scales: an fp8
    cache's scales_digest; tp_size: the tensor-parallel size (num_kv_heads: one rank's)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(identity.encode())
    h.update(f"|L{num_layers}|bs{block_size}|H{num_kv_heads}|D{head_dim}|{dtype}".encode())
    if scales is not None:
        h.update(f"|scales:{scales}".encode())
    if tp_size > 1:
        h.update(f"|tp{tp_size}".encode())
    return h.hexdigest()


def cache_namespace(identity: str, kv_cache: Any, tp_rank: int = 0, tp_size: int = 1) -> str:
    """`namespace` of a KVCache (its scales set); under TP one directory per rank,
    <digest>-tp<size>-rank<rank>, each holding that rank's slice of the KV heads."""
    ns = namespace(identity, num_layers=kv_cache.num_layers, block_size=kv_cache.block_size,
                   num_kv_heads=kv_cache.num_kv_heads, head_dim=kv_cache.head_dim, dtype=kv_cache.dtype,
                   scales=scales_digest(kv_cache.k_scales, kv_cache.v_scales) if kv_cache.is_fp8 else None,
                   tp_size=tp_size)
    return ns if tp_size == 1 else f"{ns}-tp{tp_size}-rank{tp_rank}"


def block_key(block_hash: int) -> str:
    return f"{block_hash:032x}"
