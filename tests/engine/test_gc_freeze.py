"""engine/gc_freeze.frozen_heap: what is alive when the loop starts is out of the collector's
passes during the loop, and collectable again afterwards (nothing leaks past the loop)."""

from __future__ import annotations

import gc
import weakref

from toolkit.engine.gc_freeze import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self                   # a reference cycle: only the cyclic collector frees it


def test_heap_frozen_inside_and_garbage_collected_after() -> None:
    node = _Node()
    ref = weakref.ref(node)
    with frozen_heap():
        assert gc.get_freeze_count() > 1000   # the interpreter's and torch's objects, and node
        del node
        gc.collect()
        assert ref() is not None              # frozen: a full pass skips it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None                      # after the loop it is ordinary garbage again


def test_an_earlier_small_freeze_does_not_disable_it() -> None:
    """A library that froze a few objects before (seen on the H200) must not make the freeze
    a no-op: the whole heap is frozen inside."""
    gc.collect()
    gc.freeze()
    try:
        few = gc.get_freeze_count()
        junk = [[] for _ in range(1000)]       # tracked objects made after that freeze
        with frozen_heap():
            assert gc.get_freeze_count() >= few + 1000
        del junk
    finally:
        gc.unfreeze()


def test_disabled_or_gc_off_changes_nothing() -> None:
    with frozen_heap(enabled=False):
        assert gc.get_freeze_count() == 0
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
