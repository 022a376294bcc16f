"""HostAdapterCache: adapters read from disk, kept on the host (max_cpu_loras of them, LRU),
so a slot refilled after an eviction copies from memory, not from the folder again."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from toolkit.lora.peft import AdapterWeights


class HostAdapterCache:
    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"max_cpu_loras must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self._items: OrderedDict[int, AdapterWeights] = OrderedDict()
        self.num_reads = 0                   # folder reads (misses), for tests and reprs

    def get(self, adapter_id: int, read: Callable[[], AdapterWeights]) -> AdapterWeights:
        """The adapter's weights: cached (now most recent), else read() and cached (the least
        recently used beyond capacity dropped)."""
        w = self._items.pop(adapter_id, None)
        if w is None:
            w = read()
            self.num_reads += 1
        self._items[adapter_id] = w
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return w

    def pop(self, adapter_id: int) -> None:
        self._items.pop(adapter_id, None)

    def __contains__(self, adapter_id: int) -> bool:
        return adapter_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"HostAdapterCache({len(self._items)}/{self.capacity}: {list(self._items)})"
