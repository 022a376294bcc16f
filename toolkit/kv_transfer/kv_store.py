"""KV stores: where a connector keeps blocks outside the device, keyed by strings.

A value is one KV block of every layer, a CPU tensor `[num_layers, 2, block_size,
num_kv_heads, head_dim]` (the host tier's slot layout, blocks/host_kv.py). Both stores are
LRU under a bound and thread-safe (a connector reads and writes from an I/O thread while
the scheduler looks keys up):

    put(key, block) -> bool        stored (False: larger than the whole bound); evicts LRU
    get(key) -> Tensor             KeyError when absent (evicted meanwhile), ValueError when corrupt
    get_into(key, out)             the same block written into `out` (a CPU tensor of the block's
                                   shape and dtype, e.g. a slice of a pinned staging buffer):
                                   LRUKeys' default copies get(key); the disk store reads the
                                   file straight into it
    lookup(keys) -> int            how many leading keys are held (no change)
    touch(keys), remove(key), keys(), num_blocks, nbytes, close()
    claim_format(fmt)              the KV format (keys.kv_format: layout, dtype, fp8 scales, TP
                                   rank) of every engine that uses the store; ValueError when
                                   it already holds another's (an engine never loads a block
                                   whose bytes mean something else to it)

`MemoryKVStore` is the reference twin (a dict of tensors); `DiskKVStore`
(kv_transfer/disk_store.py) keeps one memory-mapped file per block.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch


def block_nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * dtype.itemsize


def check_block(block: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> None:
    if tuple(block.shape) != tuple(shape) or block.dtype != dtype:
        raise ValueError(f"a KV block of this store must be {list(shape)} {dtype}, "
                         f"got {list(block.shape)} {block.dtype}")


def leading_hits(keys: Iterable[str], store: Any) -> int:
    """How many of `keys`, from the first, are `in store` (a prefix's blocks load in order)."""
    n = 0
    for k in keys:
        if k not in store:
            break
        n += 1
    return n


class LRUKeys:
    """What both stores share: `_lru`, an OrderedDict keyed by store key, least recently
    used first, guarded by `_lock`. `key in store` may look further than `_lru` (a
    DiskKVStore adopts a file another process wrote), so lookup asks it."""

    _lru: OrderedDict
    _lock: threading.Lock
    block_shape: tuple
    dtype: torch.dtype
    kv_format: str | None = None

    def claim_format(self, fmt: str) -> None:
        if self.kv_format is not None and self.kv_format != fmt:
            raise ValueError(f"this KV store holds blocks of KV format {self.kv_format!r}; this engine's is "
                             f"{fmt!r} (another layout, dtype, fp8 scales or tensor-parallel rank): give it "
                             "its own store")
        self.kv_format = fmt

    @property
    def num_blocks(self) -> int:
        return len(self._lru)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._lru)

    def lookup(self, keys: Iterable[str]) -> int:
        return leading_hits(keys, self)

    def touch(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                if k in self._lru:
                    self._lru.move_to_end(k)

    def get_into(self, key: str, out: torch.Tensor) -> None:
        check_block(out, self.block_shape, self.dtype)
        out.copy_(self.get(key))


class MemoryKVStore(LRUKeys):
    def __init__(self, block_shape: Sequence[int], dtype: torch.dtype, capacity_blocks: int) -> None:
        if not isinstance(capacity_blocks, int) or isinstance(capacity_blocks, bool) or capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be a positive integer, got {capacity_blocks!r}")
        self.block_shape, self.dtype = tuple(int(s) for s in block_shape), dtype
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.num_puts = self.num_gets = self.num_evicted = 0

    @property
    def nbytes(self) -> int:
        return len(self._lru) * block_nbytes(self.block_shape, self.dtype)

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    def put(self, key: str, block: torch.Tensor) -> bool:
        check_block(block, self.block_shape, self.dtype)
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return True
            while len(self._lru) >= self.capacity_blocks:
                self._lru.popitem(last=False)
                self.num_evicted += 1
            self._lru[key] = block.detach().to("cpu", copy=True)
            self.num_puts += 1
            return True

    def get(self, key: str) -> torch.Tensor:
        with self._lock:
            block = self._lru[key]          # KeyError: evicted or never stored
            self._lru.move_to_end(key)
            self.num_gets += 1
            return block

    def remove(self, key: str) -> None:
        with self._lock:
            self._lru.pop(key, None)

    def close(self) -> None:
        with self._lock:
            self._lru.clear()

    def __repr__(self) -> str:
        return (f"MemoryKVStore(blocks={self.num_blocks}/{self.capacity_blocks}, "
                f"block={list(self.block_shape)} {self.dtype})")
