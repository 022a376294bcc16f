"""The adapter pool and its twin against the public conformance machine; the host cache."""

import pytest

from toolkit.lora.host_cache import HostAdapterCache
from toolkit.lora.pool import AdapterPool, OutOfSlots
from toolkit.lora.reference import ReferenceAdapterPool
from toolkit.testing import check_adapter_pool


@pytest.mark.parametrize("factory", [AdapterPool, ReferenceAdapterPool])
@pytest.mark.parametrize("num_slots", [1, 3])
def test_conformance(factory, num_slots):
    check_adapter_pool(factory, num_slots=num_slots)


class _LeakyPool(AdapterPool):      # a pool that never frees its refcount: the suite must catch it
    def release(self, adapter_id):
        if self.refcount(adapter_id) < 1:
            raise ValueError("not held")


def test_conformance_catches_a_leak():
    with pytest.raises(AssertionError):
        check_adapter_pool(_LeakyPool, max_examples=20, shrink=False)


def test_lru_eviction_and_errors():
    pool = AdapterPool(2)
    assert pool.acquire(5) == (0, True) and pool.acquire(6) == (1, True) and pool.acquire(5) == (0, False)
    with pytest.raises(OutOfSlots):
        pool.acquire(7)
    pool.release(6)
    pool.release(5)
    pool.release(5)                  # 6 released first: least recently used
    assert pool.acquire(7) == (1, True) and pool.resident() == {5: 0, 7: 1}
    with pytest.raises(ValueError, match="not held"):
        pool.release(6)
    with pytest.raises(ValueError, match=">= 1"):
        pool.acquire(0)
    assert not pool.evict(7) and pool.evict(5) and pool.resident() == {7: 1}


def test_host_cache_lru():
    cache, reads = HostAdapterCache(2), []

    def read(i):
        return lambda: reads.append(i) or i

    for i in (1, 2, 1, 3, 2):
        cache.get(i, read(i))
    assert reads == [1, 2, 3, 2] and 1 not in cache and len(cache) == 2
