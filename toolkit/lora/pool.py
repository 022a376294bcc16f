"""AdapterPool: which adapter occupies which of a fixed number of device slots (integers
only; the stacked weights live in the LoRA layers, worker/.. lora/state.py fills them).

    acquire(id) -> (slot, load)   ref += 1; load=True: the adapter was not resident, the
                                  caller copies its weights into `slot` now
    release(id)                   ref -= 1; at 0 it stays resident, evictable (LRU)
    evict(id) -> bool             drop a resident adapter no request holds (unload)

A slot goes to an adapter as: its own slot if resident, else the lowest empty slot, else
the slot of the least recently used adapter that no running request holds. When every slot
is held, acquire raises OutOfSlots and changes nothing (the scheduler's max_loras keeps the
distinct adapters of a step within the slots, so the engine never sees it).
`reference.py` is the twin: the same decisions from plain dicts; toolkit/testing/lora_pool.py
is the conformance check both pass.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, runtime_checkable


class OutOfSlots(Exception):
    """Every device slot holds an adapter that a running request uses."""


@runtime_checkable
class AdapterPoolProtocol(Protocol):
    num_slots: int

    def acquire(self, adapter_id: int) -> tuple[int, bool]: ...
    def release(self, adapter_id: int) -> None: ...
    def evict(self, adapter_id: int) -> bool: ...
    def slot_of(self, adapter_id: int) -> int | None: ...
    def refcount(self, adapter_id: int) -> int: ...
    def num_free_slots(self) -> int: ...
    def resident(self) -> dict[int, int]: ...


def check_slots(num_slots: object) -> int:
    if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
        raise ValueError(f"an adapter pool needs num_slots >= 1 (max_loras), got {num_slots!r}")
    return num_slots


def check_id(adapter_id: object) -> int:
    if not isinstance(adapter_id, int) or isinstance(adapter_id, bool) or adapter_id < 1:
        raise ValueError(f"adapter ids are integers >= 1 (LoRARequest.lora_int_id), got {adapter_id!r}")
    return adapter_id


class AdapterPool:
    """The pool (module doc): O(1) per call but the empty-slot pick (a sorted list)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = check_slots(num_slots)
        self._slot: dict[int, int] = {}                    # resident adapter -> slot
        self._ref: dict[int, int] = {}                     # held adapter -> running requests
        self._idle: OrderedDict[int, None] = OrderedDict()  # resident, unheld: LRU first
        self._empty: list[int] = list(range(num_slots))    # ascending

    def acquire(self, adapter_id: int) -> tuple[int, bool]:
        check_id(adapter_id)
        slot = self._slot.get(adapter_id)
        load = slot is None
        if load:
            if self._empty:
                slot = self._empty.pop(0)
            elif self._idle:
                victim, _ = self._idle.popitem(last=False)
                slot = self._slot.pop(victim)
            else:
                raise OutOfSlots(f"all {self.num_slots} LoRA slots hold adapters of running requests "
                                 f"({sorted(self._ref)}); adapter {adapter_id} must wait")
            self._slot[adapter_id] = slot
        self._idle.pop(adapter_id, None)
        self._ref[adapter_id] = self._ref.get(adapter_id, 0) + 1
        return slot, load

    def release(self, adapter_id: int) -> None:
        n = self._ref.get(adapter_id, 0)
        if n < 1:
            raise ValueError(f"adapter {adapter_id!r} is not held; release only what acquire gave")
        if n == 1:
            del self._ref[adapter_id]
            self._idle[adapter_id] = None                  # most recently used
        else:
            self._ref[adapter_id] = n - 1

    def evict(self, adapter_id: int) -> bool:
        """Drop a resident adapter no request holds; False if it is held or not resident."""
        if adapter_id in self._ref or adapter_id not in self._slot:
            return False
        del self._idle[adapter_id]
        slot = self._slot.pop(adapter_id)
        self._empty.append(slot)
        self._empty.sort()
        return True

    def slot_of(self, adapter_id: int) -> int | None:
        return self._slot.get(adapter_id)

    def refcount(self, adapter_id: int) -> int:
        return self._ref.get(adapter_id, 0)

    def num_free_slots(self) -> int:
        """Slots an adapter not resident could get now (empty, or holding an unheld one)."""
        return len(self._empty) + len(self._idle)

    def resident(self) -> dict[int, int]:
        return dict(self._slot)

    def __repr__(self) -> str:
        return (f"AdapterPool(slots={self.num_slots}, resident={len(self._slot)}, held={len(self._ref)}, "
                f"free={self.num_free_slots()})")
