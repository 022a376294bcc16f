"""StoreConnector: prefix-cache blocks saved to a KV store and loaded back on a hit.

Keyed by the prefix hashes of blocks/hashing.py (keys.block_key), so a store filled by one
engine serves another (a restart, with a persistent DiskKVStore). Policy:
- scheduler side: a waiting request's full blocks after its local prefix hit are looked
  up in the store (leading run; never the block of its last token); with
  `load_async=True` (the disk tier) the request waits for them (WAITING_FOR_REMOTE_KVS);
- a finished request's full computed blocks that the store lacks are saved (write-through
  on finish, LMCache's default): request_finished returns delay_free=True and the blocks
  stay allocated until the save has its own copy;
- requests with a cache salt (prompt logprobs, adapters, tenants: a salt may be local to
  one process) are neither looked up nor saved.
Worker side: loads and saves run on one I/O thread, in submission order (a load submitted
before a save cannot lose its block to that save's eviction); device copies run on the
runner's thread, in stream order: saves gather their blocks to the host when they are
bound, finished reads are copied into their blocks in the next get_finished. A read that
fails (evicted meanwhile, a corrupt file, an injected fault) reports its blocks in
get_block_ids_with_load_errors: the scheduler recomputes the request. With
`load_async=False` (the reference twin over a MemoryKVStore) loads run in start_load_kv.
Blocks move as their raw bytes (an fp8 cache's e4m3 bytes, copied through uint8 views:
never converted), so what they mean is the store's KV format (keys.kv_format: dtype, fp8
scales, TP rank), which the engine claims for the store when it binds the connector.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import torch

from toolkit.blocks.hashing import hash_blocks
from toolkit.kv_transfer.base import KVConnectorBase, KVConnectorMetadata
from toolkit.kv_transfer.keys import block_key
from toolkit.transfer import to_device

log = logging.getLogger(__name__)

_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def raw(t: torch.Tensor) -> torch.Tensor:
    """A float8 tensor's bytes as uint8 (the same storage; index_copy_ has no float8 kernel on
    the CPU); other dtypes as they are."""
    return t.view(torch.uint8) if t.dtype in _FP8 else t


@dataclass
class Transfer:
    request_id: str
    pairs: list[tuple[str, int]]        # (store key, device block)
    is_async: bool = True
    wait_s: float = 0.0                 # a load may wait this long for keys not written yet (pd.py)


@dataclass
class StoreConnectorMetadata(KVConnectorMetadata):
    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)

    def has_work(self) -> bool:
        return bool(self.loads or self.saves)


class StoreConnector(KVConnectorBase):
    def __init__(self, store: Any, block_size: int, *, load_async: bool = True) -> None:
        super().__init__()
        self.store, self.block_size, self.load_async = store, block_size, bool(load_async)
        # scheduler side
        self._chains: dict[str, list[int]] = {}              # request id -> its full blocks' hashes
        self._matched: dict[str, tuple[int, list[str]]] = {}  # request id -> (first block, keys to load)
        self._loads: list[Transfer] = []
        self._saves: list[Transfer] = []
        self._saving: set[str] = set()                       # keys whose save is in flight
        # worker side
        self._io: ThreadPoolExecutor | None = None
        self._reading: dict[str, tuple[Transfer, Future]] = {}
        self._writing: dict[str, tuple[Transfer, Future]] = {}
        self._staged: list[tuple[Transfer, tuple]] = []   # this step's saves: ([n, L, 2, bs, H, D], event)
        self._errors: set[int] = set()
        # counters (blocks)
        self.num_hit_blocks = self.num_loaded_blocks = self.num_saved_blocks = self.num_failed_blocks = 0

    # -- scheduler side --
    def _chain(self, request: Any) -> list[int]:
        n = (request.num_tokens - 1) // self.block_size      # never the last token's block
        chain = self._chains.setdefault(request.request_id, [])
        if len(chain) < n:
            bs = self.block_size
            toks = request.all_token_ids[len(chain) * bs:n * bs]
            chain.extend(hash_blocks(toks, bs, 0, chain[-1] if chain else 0))
        return chain[:n]

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        self._matched.pop(request.request_id, None)
        if request.cache_salt or num_computed_tokens % self.block_size:
            return 0, False
        first = num_computed_tokens // self.block_size
        keys = [block_key(h) for h in self._chain(request)[first:]]
        n = self.store.lookup(keys)
        if n == 0:
            return 0, False
        self._matched[request.request_id] = (first, keys[:n])
        return n * self.block_size, self.load_async

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        first, keys = self._matched.pop(request.request_id)
        assert num_external_tokens == len(keys) * self.block_size, "allocated for a different match"
        blocks = list(block_ids[first:first + len(keys)])
        self.store.touch(keys)
        self._loads.append(Transfer(request.request_id, list(zip(keys, blocks)), self.load_async))
        self.num_hit_blocks += len(keys)

    def build_connector_meta(self, scheduler_output: Any) -> StoreConnectorMetadata:
        meta = StoreConnectorMetadata(self._loads, self._saves)
        self._loads, self._saves = [], []
        return meta

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> tuple[bool, dict | None]:
        rid = request.request_id
        self._matched.pop(rid, None)
        chain = self._chains.pop(rid, None)
        if request.cache_salt or not block_ids or request.status.name == "FINISHED_IGNORED":
            return False, None
        n = min(request.num_computed_tokens // self.block_size, len(block_ids))
        if chain is None or len(chain) < n:
            bs = self.block_size
            chain = hash_blocks(request.all_token_ids[:n * bs], bs, 0)
        pairs, held = [], []
        for i in range(n):
            k = block_key(chain[i])
            if k in self.store:
                held.append(k)
            elif k not in self._saving:
                pairs.append((k, block_ids[i]))
                self._saving.add(k)
        self.store.touch(held)               # used again: most recent in the LRU
        if not pairs:
            return False, None
        self._saves.append(Transfer(rid, pairs))
        return True, None

    def load_finished(self, request_id: str) -> None:
        """Scheduler side, when the worker side runs elsewhere (kv_transfer/tp.py): the request's
        load is over on every rank. Nothing to do here (PDConnector drops consumed handoffs)."""

    def forget_saving(self, keys: Any) -> None:
        """These keys' save is over (their blocks are in the store, or the save failed)."""
        self._saving.difference_update(keys)

    # -- worker side --
    def _pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-store-io")
        return self._io

    def start_load_kv(self) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, StoreConnectorMetadata):
            return
        for t in meta.loads:
            if t.is_async:
                self._reading[t.request_id] = (t, self._pool().submit(self._read, t))
                continue
            try:
                self._copy_in(t, self._read(t))
            except Exception as e:            # the scheduler drops this step's work for it: recomputed
                log.warning("KV load for request %s failed (%s: %s); it is recomputed", t.request_id,
                            type(e).__name__, e)
                self._errors.update(b for _, b in t.pairs)
                self.num_failed_blocks += len(t.pairs)
        self._staged = [(t, self._gather(t)) for t in meta.saves]

    def _read(self, t: Transfer) -> torch.Tensor:
        """The transfer's blocks [n, L, 2, bs, H, D] read into one host buffer (on the I/O
        thread when asynchronous), pinned when the cache is on CUDA: the device copy
        then needs no staging of its own."""
        pin = self.kv_layers[0].device.type == "cuda"
        out = torch.empty((len(t.pairs), *self.store.block_shape), dtype=self.store.dtype, pin_memory=pin)
        for i, (k, _) in enumerate(t.pairs):
            self.store.get_into(k, out[i])
        return out

    def _gather(self, t: Transfer) -> tuple[torch.Tensor, Any]:
        """The blocks of a save on the host, [n, L, 2, bs, H, D], read in stream order; on
        CUDA a non-blocking copy into pinned memory and the event the writer waits for."""
        dev = self.kv_layers[0].device
        idx = torch.tensor([b for _, b in t.pairs], dtype=torch.int64, device=dev)
        dtype = self.kv_layers[0].dtype
        per_layer = [raw(layer).index_select(1, idx).transpose(0, 1) for layer in self.kv_layers]   # [n, 2, bs, H, D]
        staged = torch.stack(per_layer, dim=1)
        if dev.type != "cuda":
            return staged.view(dtype), None
        host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
        host.copy_(staged, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host.view(dtype), done

    def _copy_in(self, t: Transfer, blocks: torch.Tensor) -> None:
        dev = self.kv_layers[0].device
        idx = torch.tensor([b for _, b in t.pairs], dtype=torch.int64, device=dev)
        blocks = to_device(blocks, dev)         # pinned staging: no host stall on CUDA
        for i, layer in enumerate(self.kv_layers):
            raw(layer).index_copy_(1, idx, raw(blocks[:, i].transpose(0, 1).to(layer.dtype)))
        self.num_loaded_blocks += len(t.pairs)

    def wait_for_save(self) -> None:
        for t, blocks in self._staged:
            self._writing[t.request_id] = (t, self._pool().submit(self._write, t, blocks))
        self._staged = []

    def _write(self, t: Transfer, staged: tuple[torch.Tensor, Any]) -> None:
        blocks, done = staged
        if done is not None:
            done.synchronize()                  # the device -> host copy has landed
        for (k, _), b in zip(t.pairs, blocks):
            self.store.put(k, b)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        recving, sending = set(), set()
        for rid, (t, fut) in list(self._reading.items()):
            if not fut.done():
                continue
            del self._reading[rid]
            recving.add(rid)
            try:
                self._copy_in(t, fut.result())
            except Exception as e:            # evicted, corrupt, a fault: recomputed by the scheduler
                log.warning("KV load for request %s failed (%s: %s); it is recomputed", rid, type(e).__name__, e)
                self._errors.update(b for _, b in t.pairs)
                self.num_failed_blocks += len(t.pairs)
        for rid, (t, fut) in list(self._writing.items()):
            if not fut.done():
                continue
            del self._writing[rid]
            sending.add(rid)
            self.forget_saving(k for k, _ in t.pairs)
            if fut.exception() is not None:
                log.warning("KV save for request %s failed: %s", rid, fut.exception())
            else:
                self.num_saved_blocks += len(t.pairs)
        return sending, recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def num_in_flight(self) -> int:
        return len(self._reading) + len(self._writing) + len(self._staged)

    def wait_for_transfers(self, timeout_s: float) -> None:
        """Until a read or write on the I/O thread is done (at once if one is), at most
        timeout_s: the GIL is released meanwhile, so the I/O thread runs at full speed."""
        futures = [f for _, f in self._reading.values()] + [f for _, f in self._writing.values()]
        if futures and timeout_s > 0:
            wait_futures(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        """Finish every save (those planned and not yet bound too: the blocks are still
        allocated), stop the I/O thread, close the store, drop the device KV cache."""
        if self._saves and self.kv_layers:
            for t in self._saves:
                self._write(t, self._gather(t))
            self._saves = []
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        if self.store is not None:            # None: built, never bound (kv_transfer/build.py)
            self.store.close()
        self._staged = []
        super().close()                       # kv_layers: the closed engine's KV cache is freed

    def __repr__(self) -> str:
        return (f"StoreConnector({self.store!r}, hits={self.num_hit_blocks}, loaded={self.num_loaded_blocks}, "
                f"saved={self.num_saved_blocks}, failed={self.num_failed_blocks})")
