"""The connector an EngineConfig asks for, and the scheduler that runs it (build_engine's
only calls into this package).

Two steps, because an fp8 cache's scales (part of what a stored block means) are set after
the scheduler, which takes the connector, is built:
    build_connector   the connector object, its store not opened yet (config-built ones)
    bind_connector    once the KV cache is final (scales set): open the store under the
                      namespace of the model and the KV format, claim that format for it,
                      register the KV cache; under tensor parallelism every rank opens its
                      own store over its slice of the KV heads (kv_transfer/tp.py)
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONNECTORS = ("disk", "pd")


@dataclass
class StoreSpec:
    """How a rank opens its store (picklable: it travels to tensor-parallel workers)."""
    kind: str                      # "disk" | "pd"
    root: str | None               # kv_cache_dir; None ("disk" only): a private temporary directory
    identity: str                  # keys.model_identity of the model
    capacity_bytes: int            # this rank's share of kv_cache_dir_gb
    block_size: int
    role: str | None = None        # "pd": kv_role
    handoff_wait_s: float = 0.0
    tmp_name: str = ""             # the temporary directory's name (a suffix per rank under TP)

    def open(self, kv_cache: Any, tp_rank: int = 0, tp_size: int = 1) -> Any:
        """This rank's connector over its own DiskKVStore, its format claimed (not registered)."""
        from toolkit.kv_transfer.disk_store import DiskKVStore
        from toolkit.kv_transfer.keys import cache_namespace, kv_format
        from toolkit.kv_transfer.kv_store import block_nbytes

        layer = kv_cache.layers[0]
        shape = (kv_cache.num_layers, 2, kv_cache.block_size, kv_cache.num_kv_heads, kv_cache.head_dim)
        ns = cache_namespace(self.identity, kv_cache, tp_rank, tp_size)
        block = block_nbytes(shape, layer.dtype)
        if self.capacity_bytes < block:
            per_rank = f" split over {tp_size} tensor-parallel ranks ({self.capacity_bytes} bytes each)" \
                if tp_size > 1 else ""
            raise ValueError(f"kv_cache_dir_gb{per_rank} holds no KV block of {block} bytes; give at least "
                             f"{block * tp_size / 2**30:.3g} GiB")
        if self.root is None:            # private and temporary: deleted at close
            name = self.tmp_name if tp_size == 1 else f"{self.tmp_name}-tp{tp_size}-rank{tp_rank}"
            store = DiskKVStore(Path(tempfile.gettempdir()) / name, shape, layer.dtype,
                                self.capacity_bytes, persistent=False)
        else:
            store = DiskKVStore(Path(self.root) / (ns if self.kind == "disk" else "pd-" + ns), shape,
                                layer.dtype, self.capacity_bytes)
        store.claim_format(kv_format(kv_cache, tp_rank, tp_size))
        return self.connector(store)

    def connector(self, store: Any) -> Any:
        if self.kind == "disk":
            from toolkit.kv_transfer.store_connector import StoreConnector

            return StoreConnector(store, self.block_size, load_async=True)
        from toolkit.kv_transfer.pd import PDConnector

        return PDConnector(store, self.block_size, self.role, handoff_wait_s=self.handoff_wait_s)


def store_spec(cfg: Any, folder: Any, tp_size: int = 1) -> StoreSpec:
    from toolkit.kv_transfer.keys import model_identity

    kind = cfg.kv_connector or "disk"
    if kind == "pd" and cfg.kv_cache_dir is None:
        raise ValueError("kv_connector='pd' needs kv_cache_dir= (a directory both engines see, e.g. under "
                         "/dev/shm), or pass a PDConnector instance whose store both engines share")
    return StoreSpec(kind, None if cfg.kv_cache_dir is None else str(cfg.kv_cache_dir), model_identity(folder),
                     int(cfg.kv_cache_dir_gb * 2**30) // tp_size, cfg.block_size, cfg.kv_role,
                     cfg.kv_handoff_wait_s, f"toolkit-kv-{uuid.uuid4().hex}")


def build_connector(cfg: Any, kv_cache: Any, folder: Any, executor: Any) -> Any:
    """A connector for `kv_cache` (a KVCache) from cfg.kv_connector / kv_role / kv_cache_dir;
    its store is opened by bind_connector. An instance is returned as it is."""
    spec = cfg.kv_connector
    tp_size = getattr(executor, "size", 1) if executor is not None else 1
    if spec is not None and not isinstance(spec, str):
        if tp_size > 1:
            raise ValueError("a KV connector instance cannot serve tensor_parallel_size > 1: every rank "
                             "opens its own store over its slice of the KV heads; use kv_connector='disk' "
                             "or 'pd' with kv_cache_dir=")
        return spec                                   # an instance (checked by the scheduler)
    plan = store_spec(cfg, folder, tp_size)
    if tp_size > 1:
        from toolkit.kv_transfer.tp import TPConnector

        return TPConnector(plan, executor)
    return plan.connector(None)                       # the store: opened by bind_connector


def bind_connector(cfg: Any, connector: Any, kv_cache: Any, folder: Any, executor: Any) -> None:
    """Once the KV cache is final (an fp8 cache's scales set): open the store of a config-built
    connector under the namespace of the model and the KV format, claim that format for a
    given connector's store (refused when it holds another's), register the KV cache."""
    from toolkit.kv_transfer.keys import kv_format

    if cfg.kv_connector is not None and not isinstance(cfg.kv_connector, str):
        store = getattr(connector, "store", None)
        want = (kv_cache.num_layers, 2, kv_cache.block_size, kv_cache.num_kv_heads, kv_cache.head_dim)
        got = (tuple(getattr(store, "block_shape", want)), getattr(store, "dtype", kv_cache.dtype))
        if got != (want, kv_cache.dtype):
            raise ValueError(f"the KV connector's store holds blocks of {list(got[0])} {got[1]}; this engine's "
                             f"are {list(want)} {kv_cache.dtype} ([layers, 2, block_size, kv heads, head_dim], "
                             "the KV cache dtype: float8_e4m3fn with kv_cache_dtype='fp8')")
        if callable(getattr(store, "claim_format", None)):
            store.claim_format(kv_format(kv_cache))
        connector.register_kv_caches(kv_cache.layers)
        return
    if getattr(connector, "is_tensor_parallel", False):
        connector.open(kv_cache)                      # every rank's store, and the scheduler's view
        return
    store = store_spec(cfg, folder).open(kv_cache).store
    connector.store = store
    connector.register_kv_caches(kv_cache.layers)


def connector_scheduler(scheduler: Any) -> Any:
    """The scheduler part that runs a connector: "continuous" -> ConnectorScheduler; a class or
    instance that declares supports_kv_connector as it is."""
    from toolkit.kv_transfer.scheduler import ConnectorScheduler
    from toolkit.schedulers.continuous import ContinuousBatchingScheduler

    if scheduler == "continuous" or scheduler is ContinuousBatchingScheduler:
        return ConnectorScheduler
    if getattr(scheduler, "supports_kv_connector", False):
        return scheduler
    raise ValueError(f"a KV connector needs a scheduler that supports it ('continuous', or one that "
                     f"declares supports_kv_connector = True); got {scheduler!r}")
