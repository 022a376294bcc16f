"""DiskKVStore: KV blocks in memory-mapped files, one file per block, under a size bound.

    <root>/<key>.kv     the block's bytes, [num_layers, 2, block_size, num_kv_heads, head_dim]
                        (an fp8 cache's raw e4m3 bytes: their scales are the format's)
    <root>/FORMAT       the KV format claimed for the directory (claim_format), created once
                        and atomically by the first claim: a store of another format over it
                        is refused, even one claiming at the same moment in another process

`root` should name the model and the KV layout (kv_transfer/keys.py's `namespace`), so a
directory shared by several models or layouts never hands one the other's blocks. A write
goes to a temporary file renamed into place (a crash leaves no half-written block under a
key); a read copies the file into the caller's tensor (`get_into`: a pinned staging
buffer's slice, so a load is one host copy before the device copy). The
index (key -> bytes, LRU order) is rebuilt from the directory at start, oldest
modification time first, so a persistent store survives a restart; a read refreshes a
file's time. A key missing from the index is looked up in the directory too (another
process may share it: prefill/decode across processes); the size bound counts the
blocks this process knows of. `persistent=False` deletes the directory at close().
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch

from toolkit.kv_transfer.kv_store import LRUKeys, block_nbytes, check_block

SUFFIX = ".kv"
FORMAT_FILE = "FORMAT"


class DiskKVStore(LRUKeys):
    def __init__(self, root: str | os.PathLike, block_shape: Sequence[int], dtype: torch.dtype,
                 capacity_bytes: int, *, persistent: bool = True) -> None:
        if not isinstance(capacity_bytes, int) or isinstance(capacity_bytes, bool) or capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be a positive integer, got {capacity_bytes!r}")
        self.root = Path(root)           # made by the first claim_format or put
        self.block_shape, self.dtype = tuple(int(s) for s in block_shape), dtype
        self.block_bytes = block_nbytes(self.block_shape, dtype)
        self.capacity_blocks = capacity_bytes // self.block_bytes
        if self.capacity_blocks < 1:
            raise ValueError(f"a disk KV store of {capacity_bytes} bytes holds no block of "
                             f"{self.block_bytes} bytes; give at least {self.block_bytes}")
        self.persistent = bool(persistent)
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, None] = OrderedDict()   # keys, least recently used first
        self.num_puts = self.num_gets = self.num_evicted = 0
        self._odd: list[Path] = []       # files of another size: deleted once a claim succeeds
        self._scan()

    def _scan(self) -> None:
        found = []
        for p in (self.root.iterdir() if self.root.is_dir() else ()):
            if p.name.startswith(".tmp-"):
                p.unlink(missing_ok=True)        # a write that never finished
            elif p.suffix == SUFFIX:
                st = p.stat()
                if st.st_size == self.block_bytes:
                    found.append((st.st_mtime_ns, p.stem))
                else:                            # a truncated block, or another format's
                    self._odd.append(p)          # (then the claim refuses: they stay)
        for _, key in sorted(found):
            self._lru[key] = None
        while len(self._lru) > self.capacity_blocks:    # a smaller bound than last time
            self._evict_one()

    def claim_format(self, fmt: str) -> None:
        """Claim the directory for `fmt`: the first claim creates FORMAT (written aside, then
        linked into place: exactly one of two racing claims creates it); a later one reads it
        and is refused when it differs. Then the files of another size go."""
        path = self.root / FORMAT_FILE
        if self.kv_format is None:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".tmp-{uuid.uuid4().hex}"
            tmp.write_text(fmt + "\n")
            try:
                os.link(tmp, path)               # fails when FORMAT exists
            except FileExistsError:
                self.kv_format = path.read_text().strip() or None
            finally:
                tmp.unlink(missing_ok=True)
        super().claim_format(fmt)
        for p in self._odd:
            p.unlink(missing_ok=True)
        self._odd = []

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"a store key must be a non-empty file name, got {key!r}")
        return self.root / (key + SUFFIX)

    @property
    def nbytes(self) -> int:
        return len(self._lru) * self.block_bytes

    def __contains__(self, key: str) -> bool:
        return key in self._lru or self._adopt(key)

    def _adopt(self, key: str) -> bool:
        """A file another process wrote (a shared directory: prefill/decode across processes)."""
        try:
            ok = self._path(key).stat().st_size == self.block_bytes
        except (FileNotFoundError, ValueError):
            return False
        if ok:
            with self._lock:
                self._lru.setdefault(key, None)
        return ok

    def put(self, key: str, block: torch.Tensor) -> bool:
        check_block(block, self.block_shape, self.dtype)
        path = self._path(key)
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return True
            while len(self._lru) >= self.capacity_blocks:
                self._evict_one()
        raw = block.detach().to("cpu").contiguous().view(torch.uint8).numpy()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        raw.tofile(tmp)
        os.replace(tmp, path)
        with self._lock:
            self._lru[key] = None
            self.num_puts += 1
        return True

    def get(self, key: str) -> torch.Tensor:
        block = torch.empty(self.block_shape, dtype=self.dtype)
        self.get_into(key, block)
        return block

    def get_into(self, key: str, out: torch.Tensor) -> None:
        """The block's file read straight into `out` (contiguous, the block's shape and dtype):
        one copy from the page cache, into pinned memory when `out` is."""
        check_block(out, self.block_shape, self.dtype)
        if not out.is_contiguous():
            raise ValueError("get_into needs a contiguous out tensor")
        path = self._path(key)
        if key not in self:
            raise KeyError(key)
        self.touch([key])
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size != self.block_bytes:
                    raise ValueError(f"KV block file {path} has {size} bytes, expected {self.block_bytes}")
                view = out.view(torch.uint8).view(-1).numpy()
                done = 0
                while done < size:                        # readinto may return short counts
                    n = f.readinto(memoryview(view[done:]))
                    if not n:
                        raise ValueError(f"KV block file {path} ended after {done} of {size} bytes")
                    done += n
        except FileNotFoundError:                          # evicted meanwhile (by another process)
            self.remove(key)
            raise KeyError(key) from None
        except ValueError:
            self.remove(key)
            raise
        os.utime(path)                                    # LRU order survives a restart
        self.num_gets += 1

    def remove(self, key: str) -> None:
        with self._lock:
            self._lru.pop(key, None)
            self._path(key).unlink(missing_ok=True)

    def _evict_one(self) -> None:
        key, _ = self._lru.popitem(last=False)
        self._path(key).unlink(missing_ok=True)
        self.num_evicted += 1

    def files(self) -> list[Path]:
        return sorted(self.root.glob("*" + SUFFIX))

    def close(self) -> None:
        """Keep the files (persistent) or delete the directory."""
        if not self.persistent:
            with self._lock:
                self._lru.clear()
            shutil.rmtree(self.root, ignore_errors=True)

    def __repr__(self) -> str:
        return (f"DiskKVStore({str(self.root)!r}, blocks={self.num_blocks}/{self.capacity_blocks}, "
                f"{self.nbytes / 2**20:.1f} MiB, persistent={self.persistent})")
