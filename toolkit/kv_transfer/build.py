"""The connector an EngineConfig asks for, and the scheduler that runs it (build_engine's
only calls into this package)."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

CONNECTORS = ("disk", "pd")


def build_connector(cfg: Any, kv_cache: Any, folder: Any, executor: Any) -> Any:
    """A connector for `kv_cache` (a KVCache) from cfg.kv_connector / kv_role / kv_cache_dir."""
    from toolkit.kv_transfer.disk_store import DiskKVStore
    from toolkit.kv_transfer.keys import model_identity, namespace

    spec = cfg.kv_connector
    if spec is not None and not isinstance(spec, str):
        return spec                                   # an instance (checked by the scheduler)
    if executor is not None:
        raise ValueError("a KV connector (kv_connector / kv_cache_dir) does not support "
                         "tensor_parallel_size > 1 yet; use one of them")
    if kv_cache.is_fp8:
        raise ValueError("a KV connector does not support kv_cache_dtype='fp8' yet; use 'auto'")
    name = spec or "disk"
    layer = kv_cache.layers[0]
    shape = (kv_cache.num_layers, 2, kv_cache.block_size, kv_cache.num_kv_heads, kv_cache.head_dim)
    ns = namespace(model_identity(folder), num_layers=kv_cache.num_layers, block_size=kv_cache.block_size,
                   num_kv_heads=kv_cache.num_kv_heads, head_dim=kv_cache.head_dim, dtype=layer.dtype)
    capacity = int(cfg.kv_cache_dir_gb * 2**30)
    if name == "disk":
        from toolkit.kv_transfer.store_connector import StoreConnector

        if cfg.kv_cache_dir is None:                  # private and temporary: deleted at close
            root = Path(tempfile.gettempdir()) / f"toolkit-kv-{uuid.uuid4().hex}"   # made on first save
            store = DiskKVStore(root, shape, layer.dtype, capacity, persistent=False)
        else:
            store = DiskKVStore(Path(cfg.kv_cache_dir) / ns, shape, layer.dtype, capacity)
        return StoreConnector(store, kv_cache.block_size, load_async=True)
    from toolkit.kv_transfer.pd import PDConnector

    if cfg.kv_cache_dir is None:
        raise ValueError("kv_connector='pd' needs kv_cache_dir= (a directory both engines see, e.g. under "
                         "/dev/shm), or pass a PDConnector instance whose store both engines share")
    store = DiskKVStore(Path(cfg.kv_cache_dir) / ("pd-" + ns), shape, layer.dtype, capacity)
    return PDConnector(store, kv_cache.block_size, cfg.kv_role, handoff_wait_s=cfg.kv_handoff_wait_s)


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
