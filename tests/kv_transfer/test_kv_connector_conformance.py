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


@pytest.mark.parametrize("kind", ["memory", "disk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_get_into_a_staging_slice_equals_get(tmp_path, kind, dtype):
    """get_into (what the connector reads with) fills a slice of a bigger buffer with the same
    bytes get returns, the disk store's straight from the file; a wrong out is refused."""
    store = _store(kind, tmp_path, dtype)
    blocks = torch.randn(3, *SHAPE).to(dtype)
    for i in range(3):
        store.put(f"k{i}", blocks[i])
    staging = torch.full((4, *SHAPE), float("nan")).to(dtype)      # poisoned: unwritten rows show
    for i in (2, 0, 1):
        store.get_into(f"k{i}", staging[i])
    as_bytes = lambda t: t.view(torch.uint8)
    assert torch.equal(as_bytes(staging[:3]), as_bytes(blocks))
    assert torch.equal(as_bytes(store.get("k1")), as_bytes(blocks[1]))
    with pytest.raises(ValueError):
        store.get_into("k0", torch.empty(SHAPE, dtype=torch.float64))
    with pytest.raises(KeyError):
        store.get_into("absent", staging[3])


def test_a_truncated_or_vanished_block_file_is_refused_and_forgotten(tmp_path):
    store = _store("disk", tmp_path)
    for i in range(2):
        store.put(f"k{i}", torch.randn(SHAPE))
    path = store._path("k0")
    path.write_bytes(path.read_bytes()[:100])                       # a torn write by another process
    with pytest.raises(ValueError, match="bytes"):
        store.get_into("k0", torch.empty(SHAPE))
    assert "k0" not in store.keys()
    store._path("k1").unlink()                                      # evicted by another process
    with pytest.raises(KeyError):
        store.get("k1")
    assert store.num_blocks == 0
