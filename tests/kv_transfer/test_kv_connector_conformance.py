"""The public KV-connector conformance check on the toolkit's connectors: the reference
(a synchronous StoreConnector over a MemoryKVStore), the disk tier (async, memory-mapped
files), and a prefill/decode producer-consumer pair over memory and over disk."""

from __future__ import annotations

import pytest
import torch

from toolkit.kv_transfer.disk_store import DiskKVStore
from toolkit.kv_transfer.kv_store import MemoryKVStore
from toolkit.kv_transfer.pd import PDConnector
from toolkit.kv_transfer.store_connector import StoreConnector
from toolkit.testing import check_kv_connector

GEOM = dict(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8)
SHAPE = (2, 2, 4, 2, 8)


def _store(kind, tmp_path, dtype=torch.float32):
    if kind == "memory":
        return MemoryKVStore(SHAPE, dtype, 64)
    return DiskKVStore(tmp_path / "kv", SHAPE, dtype, 64 * 2 * 2 * 4 * 2 * 8 * dtype.itemsize)


@pytest.mark.parametrize("kind,load_async", [("memory", False), ("memory", True), ("disk", True), ("disk", False)])
def test_store_connector(tmp_path, kind, load_async):
    c = StoreConnector(_store(kind, tmp_path), 4, load_async=load_async)
    try:
        check_kv_connector(c, **GEOM)
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_pd_pair(tmp_path, kind):
    store = _store(kind, tmp_path)
    prod, cons = PDConnector(store, 4, "kv_producer"), PDConnector(store, 4, "kv_consumer")
    try:
        check_kv_connector(prod, cons, same_request_id=True, **GEOM)
    finally:
        prod.close()


def test_bf16_blocks_round_trip_through_disk(tmp_path):
    c = StoreConnector(_store("disk", tmp_path, torch.bfloat16), 4)
    try:
        check_kv_connector(c, dtype=torch.bfloat16, **GEOM)
    finally:
        c.close()


class _Forgetful(StoreConnector):
    """A broken connector: reports a delayed save done twice."""

    def get_finished(self, finished_req_ids):
        sending, recving = super().get_finished(finished_req_ids)
        self._again = getattr(self, "_again", set()) | sending
        return self._again, recving


def test_check_catches_a_broken_connector(tmp_path):
    with pytest.raises(AssertionError, match="finished_sending"):
        check_kv_connector(_Forgetful(_store("memory", tmp_path), 4), **GEOM)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_store_connector_on_cuda(tmp_path, kind):
    """Saves through pinned memory and an event, loads through pinned staging (bf16)."""
    c = StoreConnector(_store(kind, tmp_path, torch.bfloat16), 4)
    try:
        check_kv_connector(c, dtype=torch.bfloat16, device="cuda", **GEOM)
    finally:
        c.close()
