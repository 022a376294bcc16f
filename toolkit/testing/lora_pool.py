"""Conformance suite for adapter pools (toolkit/lora/pool.py's contract): a hypothesis state
machine of running requests acquiring and releasing adapters, run step by step against
ReferenceAdapterPool.

    from toolkit.testing import check_adapter_pool
    check_adapter_pool(MyPool)                  # factory(num_slots)

Invariants, after every step:
- acquire gives the reference's slot and the same load flag (resident: no load; else the
  lowest empty slot, else the least recently used unheld adapter's slot); a resident
  adapter's slot never changes while it is held;
- refcount of every adapter equals the requests holding it; num_free_slots() and
  resident() equal the reference's; no two adapters share a slot;
- acquire with every slot held raises OutOfSlots and changes nothing; releasing what is not
  held raises ValueError and changes nothing; evict of a held adapter returns False;
- with every request gone, no adapter is held and every slot is free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from toolkit.lora.pool import OutOfSlots
from toolkit.lora.reference import ReferenceAdapterPool

ADAPTERS = st.integers(1, 7)


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def adapter_pool_machine(factory: Callable[[int], Any], num_slots: int = 3) -> type:
    class AdapterPoolMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pool, self.ref = factory(num_slots), ReferenceAdapterPool(num_slots)
            self.held: list[int] = []          # one entry per running request's adapter

        def _state(self, pool: Any) -> tuple:
            return pool.resident(), pool.num_free_slots()

        @rule(adapter=ADAPTERS)
        def acquire(self, adapter: int) -> None:
            before = self._state(self.pool)
            try:
                want = self.ref.acquire(adapter)
            except OutOfSlots:
                try:
                    self.pool.acquire(adapter)
                except OutOfSlots:
                    _expect(self._state(self.pool) == before, "a refused acquire changed the pool")
                    return
                raise AssertionError(f"acquire({adapter}) succeeded with every slot held")
            got = self.pool.acquire(adapter)
            _expect(tuple(got) == want, f"acquire({adapter}) gave (slot, load) {got}, the reference {want}")
            self.held.append(adapter)

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 99))
        def release(self, i: int) -> None:
            adapter = self.held.pop(i % len(self.held))
            self.pool.release(adapter)
            self.ref.release(adapter)

        @rule(adapter=ADAPTERS)
        def release_unheld(self, adapter: int) -> None:
            if adapter in self.held:
                return
            before = self._state(self.pool)
            try:
                self.pool.release(adapter)
            except ValueError:
                _expect(self._state(self.pool) == before, "a refused release changed the pool")
                return
            raise AssertionError(f"release({adapter}) of an adapter no request holds did not raise")

        @rule(adapter=ADAPTERS)
        def evict(self, adapter: int) -> None:
            got, want = self.pool.evict(adapter), self.ref.evict(adapter)
            _expect(got == want, f"evict({adapter}) returned {got}, the reference {want}")
            _expect(not (got and adapter in self.held), f"evicted held adapter {adapter}")

        @invariant()
        def matches_reference(self) -> None:
            res = self.pool.resident()
            _expect(res == self.ref.resident(), f"resident {res} != reference {self.ref.resident()}")
            _expect(len(set(res.values())) == len(res), f"two adapters share a slot: {res}")
            _expect(all(0 <= s < num_slots for s in res.values()), f"slot out of range: {res}")
            _expect(self.pool.num_free_slots() == self.ref.num_free_slots(),
                    f"num_free_slots {self.pool.num_free_slots()} != reference {self.ref.num_free_slots()}")
            for a in range(1, 8):
                _expect(self.pool.refcount(a) == self.held.count(a),
                        f"refcount({a}) = {self.pool.refcount(a)}, {self.held.count(a)} requests hold it")

        def teardown(self) -> None:
            for a in self.held:
                self.pool.release(a)
            _expect(all(self.pool.refcount(a) == 0 for a in range(1, 8)), "references left after release")
            _expect(self.pool.num_free_slots() == num_slots, "slots held with no request left")

    return AdapterPoolMachine


def check_adapter_pool(factory: Callable[[int], Any], *, num_slots: int = 3, max_examples: int | None = None,
                       stateful_step_count: int = 40, shrink: bool = True) -> None:
    """Run the conformance machine; raises AssertionError on the first violation.
    factory(num_slots) -> pool. max_examples=None takes the loaded hypothesis profile's."""
    if not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"num_slots must be an integer >= 1, got {num_slots!r}")
    kw: dict[str, Any] = {"stateful_step_count": stateful_step_count, "deadline": None,
                          "suppress_health_check": [HealthCheck.too_slow]}
    if max_examples is not None:
        kw["max_examples"] = max_examples
    if not shrink:
        kw["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    run_state_machine_as_test(adapter_pool_machine(factory, num_slots), settings=settings(**kw))
