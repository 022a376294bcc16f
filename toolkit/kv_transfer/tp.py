"""TPConnector: a config-built connector ("disk", "pd") under tensor parallelism.

Each rank holds a slice of the KV heads, so each rank saves and loads its own slice: its own
StoreConnector / PDConnector (the worker side, attached to the rank's ModelRunner as
`kv_connector`) over its own DiskKVStore, in the directory `<namespace>-tp<N>-rank<r>`
(keys.cache_namespace: the TP size and the rank are part of the KV format, so an engine of
another TP size starts cold and never reads a slice of other heads).

The scheduler side runs once, in the engine (rank 0's process): an inner connector of the
same kind over a `RanksView`, which holds a key only when every rank's directory holds its
block file, so the number of loadable tokens is decided once and is the same for all ranks
(a rank that lost a block, e.g. evicted it, cuts every rank's leading run there). The view
queues the scheduler side's touches and removals; they go to the ranks with the next step's
metadata, so each rank's LRU order follows the scheduler's.

One step: the runner's connector_step binds the step's metadata; get_finished sends it, with
the finished request ids, to every rank at once (`executor.call`: one round trip, the ranks
in parallel; skipped when there is nothing to send or wait for), where the rank's connector
runs the TP=1 worker step over its slice. The replies are merged: a transfer is finished
when every rank reported it, and it carries the blocks any rank failed to load (the
scheduler recomputes that request, on every rank). A block a rank loaded after the lookup
but lost meanwhile fails on that rank only, which is enough.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.kv_transfer.base import KVConnectorBase, KVConnectorMetadata
from toolkit.kv_transfer.disk_store import SUFFIX
from toolkit.kv_transfer.kv_store import leading_hits

log = logging.getLogger(__name__)


class RanksView:
    """The scheduler side's store: every rank's directory, read by file name and size only."""

    def __init__(self, roots: Sequence[str | Path], block_bytes: Sequence[int]) -> None:
        self.roots = [Path(r) for r in roots]
        self.block_bytes = list(block_bytes)
        self.touches: list[str] = []          # for the ranks, with the next step's metadata
        self.removes: list[str] = []

    def __contains__(self, key: str) -> bool:
        for root, n in zip(self.roots, self.block_bytes):
            try:
                if (root / (key + SUFFIX)).stat().st_size != n:
                    return False
            except (FileNotFoundError, NotADirectoryError):
                return False
        return True

    def lookup(self, keys: Iterable[str]) -> int:
        return leading_hits(keys, self)

    def touch(self, keys: Iterable[str]) -> None:
        self.touches.extend(keys)

    def remove(self, key: str) -> None:
        self.removes.append(key)

    def take_ops(self) -> tuple[list[str], list[str]]:
        ops = (self.touches, self.removes)
        self.touches, self.removes = [], []
        return ops

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"RanksView({len(self.roots)} ranks, {str(self.roots[0].parent)!r})"


@dataclass
class TPMetadata(KVConnectorMetadata):
    inner: Any = None                                   # the inner connector's metadata (every rank runs it)
    touches: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    idle: bool = False                                  # the engine's step schedules nothing (worker.is_idle)

    def has_work(self) -> bool:
        return bool(self.touches or self.removes or getattr(self.inner, "loads", None)
                    or getattr(self.inner, "saves", None))


# -- on every rank (module-level: executor.call pickles them for the workers) --

def open_rank(shard: Any, spec: Any, size: int) -> tuple[str, int]:
    """This rank's connector over its own store, on its own KV cache; (its root, block bytes)."""
    rank = shard.model.group.rank
    connector = spec.open(shard.kv_cache, rank, size)
    connector.register_kv_caches(shard.kv_cache.layers)
    shard.kv_connector = connector
    return str(connector.store.root), connector.store.block_bytes


def step_rank(shard: Any, meta: TPMetadata, finished: set[str]) -> tuple[set, set, set, dict]:
    """The TP=1 worker step over this rank's slice: (sending, recving, failed blocks, counters)."""
    from toolkit.kv_transfer.worker import IDLE_WAIT_S, connector_step
    from toolkit.types import SchedulerOutput

    c = shard.kv_connector
    c.store.touch(meta.touches)
    for k in meta.removes:
        c.store.remove(k)
    out = SchedulerOutput(finished_ids=sorted(finished), kv_connector_metadata=meta.inner)
    # the engine's step is idle (not this rank's empty `out`): wait a little for a transfer
    idle = meta.idle and not finished and not meta.has_work()
    kvo = connector_step(c, out, shard.kv_cache.num_layers, idle_wait_s=IDLE_WAIT_S if idle else 0.0)
    return kvo.finished_sending, kvo.finished_recving, kvo.invalid_block_ids, rank_counters(shard)


def rank_counters(shard: Any) -> dict:
    c = shard.kv_connector
    return dict(loaded=c.num_loaded_blocks, saved=c.num_saved_blocks, failed=c.num_failed_blocks,
                in_flight=c.num_in_flight())


def store_state(shard: Any) -> dict:
    """This rank's store as a leak check reads it (lists the directory: not per step)."""
    store = shard.kv_connector.store
    return dict(root=str(store.root), stored=store.num_blocks, capacity=store.capacity_blocks,
                files=len(store.files()), partial=len(list(Path(store.root).glob(".tmp-*"))),
                in_flight=shard.kv_connector.num_in_flight(), saving=len(shard.kv_connector._saving))


def close_rank(shard: Any) -> dict:
    """Finish this rank's saves, stop its I/O thread, close its store; its last counters."""
    c = getattr(shard, "kv_connector", None)
    if c is None:                      # never opened here (a build that failed before)
        return {}
    c.close()
    counters = dict(loaded=c.num_loaded_blocks, saved=c.num_saved_blocks, failed=c.num_failed_blocks)
    shard.kv_connector = None
    return counters


class TPConnector(KVConnectorBase):
    """The engine's connector under tensor parallelism (the scheduler side, and the runner's
    worker side that drives the ranks). Counters: num_hit_blocks is the scheduler side's;
    num_loaded_blocks / num_saved_blocks count blocks every rank loaded / saved (the least of
    the ranks), num_failed_blocks the most any rank failed; per rank in `rank_counters`."""

    is_tensor_parallel = True

    def __init__(self, spec: Any, executor: Any) -> None:
        super().__init__()
        self.spec, self.executor, self.size = spec, executor, executor.size
        self.inner: Any = None                    # the scheduler side (opened by `open`)
        self.rank_counters: list[dict] = [{} for _ in range(self.size)]
        self._recv: dict[str, set[int]] = {}      # async loads: request id -> ranks not done yet
        self._send: dict[str, set[int]] = {}      # saves: request id -> ranks not done yet
        self._save_keys: dict[str, list[str]] = {}
        self._owner: dict[int, str] = {}          # device block -> the request whose async load fills it
        self._bad: dict[str, set[int]] = {}       # request id -> blocks some rank failed to load
        self._errors: set[int] = set()            # failed blocks of synchronous loads: reported at once

    def open(self, kv_cache: Any) -> None:
        """Every rank opens its store over its KV cache; the scheduler side views them all."""
        opened = self.executor.call(open_rank, self.spec, self.size)
        self.inner = self.spec.connector(RanksView([r for r, _ in opened], [n for _, n in opened]))

    # -- scheduler side: the inner connector's --
    @property
    def store(self) -> Any:
        return self.inner.store

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return self.inner.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        self.inner.update_state_after_alloc(request, block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> TPMetadata:
        touches, removes = self.inner.store.take_ops()
        idle = scheduler_output is not None and not scheduler_output.scheduled   # a SchedulerOutput
        return TPMetadata(self.inner.build_connector_meta(scheduler_output), touches, removes, idle)

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> tuple[bool, dict | None]:
        return self.inner.request_finished(request, block_ids)

    # -- worker side: every rank's --
    def start_load_kv(self) -> None:
        return None                               # the ranks load in get_finished's one round trip

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TPMetadata):
            meta = TPMetadata()
        if not meta.has_work() and not self._recv and not self._send:
            return set(), set()
        self._expect(meta)
        replies = self.executor.call(step_rank, meta, set(finished_req_ids))
        return self._merge(replies)

    def _expect(self, meta: TPMetadata) -> None:
        ranks = set(range(self.size))
        for t in getattr(meta.inner, "loads", ()):
            if t.is_async:
                self._recv[t.request_id] = set(ranks)
                self._owner.update((b, t.request_id) for _, b in t.pairs)
        for t in getattr(meta.inner, "saves", ()):
            self._send[t.request_id] = set(ranks)
            self._save_keys[t.request_id] = [k for k, _ in t.pairs]

    def _merge(self, replies: list[tuple]) -> tuple[set[str], set[str]]:
        sending, recving = set(), set()
        for rank, (sent, recvd, failed, counters) in enumerate(replies):
            self.rank_counters[rank] = counters
            for b in failed:
                rid = self._owner.get(b)
                if rid is None:
                    self._errors.add(b)           # a synchronous load: its step is this one
                else:
                    self._bad.setdefault(rid, set()).add(b)
            for rid in recvd:
                if self._done(self._recv, rid, rank):
                    recving.add(rid)
            for rid in sent:
                if self._done(self._send, rid, rank):
                    sending.add(rid)
        for rid in recving:
            self._owner = {b: r for b, r in self._owner.items() if r != rid}
            self._errors |= self._bad.pop(rid, set())
            self.inner.load_finished(rid)
        for rid in sending:
            self.inner.forget_saving(self._save_keys.pop(rid, ()))
        return sending, recving

    @staticmethod
    def _done(waiting: dict[str, set[int]], rid: str, rank: int) -> bool:
        left = waiting.get(rid)
        if left is None:
            return False
        left.discard(rank)
        if left:
            return False
        del waiting[rid]
        return True

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    # -- counters, close --
    def _least(self, name: str) -> int:
        return min((c.get(name, 0) for c in self.rank_counters), default=0)

    @property
    def num_hit_blocks(self) -> int:
        return self.inner.num_hit_blocks if self.inner is not None else 0

    @property
    def num_loaded_blocks(self) -> int:
        return self._least("loaded")

    @property
    def num_saved_blocks(self) -> int:
        return self._least("saved")

    @property
    def num_failed_blocks(self) -> int:
        return max((c.get("failed", 0) for c in self.rank_counters), default=0)

    def num_in_flight(self) -> int:
        """Transfers some rank has not finished (as of the last step's replies)."""
        return len(self._recv) + len(self._send) + max((c.get("in_flight", 0) for c in self.rank_counters),
                                                       default=0)

    def close(self) -> None:
        """Send the saves planned and not yet sent (their blocks are still allocated), then every
        rank finishes its saves and closes its store."""
        if self.inner is None:
            return
        try:
            planned = self.inner.build_connector_meta(None)
            touches, removes = self.inner.store.take_ops()
            planned.loads = []
            meta = TPMetadata(planned, touches, removes)
            if meta.has_work():
                self._expect(meta)
                self._merge(self.executor.call(step_rank, meta, set()))
        except Exception as e:  # noqa: BLE001 - a dead rank: the engine is closing anyway
            log.warning("sending the KV connector's last saves failed (%s: %s); they are lost",
                        type(e).__name__, e)
        try:                    # apart from the saves: a rank that failed them still closes
            for rank, counters in enumerate(self.executor.call(close_rank)):
                self.rank_counters[rank].update(counters)
        except Exception as e:  # noqa: BLE001
            log.warning("closing the KV connector's ranks failed (%s: %s)", type(e).__name__, e)
            if self.spec.root is None:          # the temporary tier: no rank may leave its directory
                for root in self.inner.store.roots:
                    shutil.rmtree(root, ignore_errors=True)
        self.inner.close()
        self._recv.clear()
        self._send.clear()
        super().close()

    def __repr__(self) -> str:
        return (f"TPConnector({self.spec.kind}, tp={self.size}, {self.inner.store if self.inner else None!r}, "
                f"hits={self.num_hit_blocks}, loaded={self.num_loaded_blocks}, saved={self.num_saved_blocks}, "
                f"failed={self.num_failed_blocks})")
