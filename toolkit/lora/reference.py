"""The adapter pool's reference twin: AdapterPool's decisions (lora/pool.py) from plain
dicts and a clock, obviously right and slow (a scan per acquire)."""

from __future__ import annotations

from toolkit.lora.pool import OutOfSlots, check_id, check_slots


class ReferenceAdapterPool:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = check_slots(num_slots)
        self.owner: dict[int, int] = {}          # slot -> adapter
        self.refs: dict[int, int] = {}           # adapter -> refcount (resident ones only)
        self.last_used: dict[int, int] = {}      # adapter -> tick of its last acquire / release
        self.tick = 0

    def _touch(self, adapter_id: int) -> None:
        self.tick += 1
        self.last_used[adapter_id] = self.tick

    def acquire(self, adapter_id: int) -> tuple[int, bool]:
        check_id(adapter_id)
        slot = self.slot_of(adapter_id)
        load = slot is None
        if load:
            empty = [s for s in range(self.num_slots) if s not in self.owner]
            idle = [(self.last_used[a], s) for s, a in self.owner.items() if self.refs[a] == 0]
            if empty:
                slot = min(empty)
            elif idle:
                slot = min(idle)[1]
                victim = self.owner[slot]
                del self.refs[victim], self.last_used[victim]
            else:
                raise OutOfSlots(f"all {self.num_slots} slots are held")
            self.owner[slot] = adapter_id
            self.refs[adapter_id] = 0
        self.refs[adapter_id] += 1
        self._touch(adapter_id)
        return slot, load

    def release(self, adapter_id: int) -> None:
        if self.refs.get(adapter_id, 0) < 1:
            raise ValueError(f"adapter {adapter_id!r} is not held")
        self.refs[adapter_id] -= 1
        self._touch(adapter_id)

    def evict(self, adapter_id: int) -> bool:
        slot = self.slot_of(adapter_id)
        if slot is None or self.refs[adapter_id] > 0:
            return False
        del self.owner[slot], self.refs[adapter_id], self.last_used[adapter_id]
        return True

    def slot_of(self, adapter_id: int) -> int | None:
        return next((s for s, a in self.owner.items() if a == adapter_id), None)

    def refcount(self, adapter_id: int) -> int:
        return self.refs.get(adapter_id, 0)

    def num_free_slots(self) -> int:
        return self.num_slots - sum(1 for a in self.owner.values() if self.refs[a] > 0)

    def resident(self) -> dict[int, int]:
        return {a: s for s, a in self.owner.items()}
