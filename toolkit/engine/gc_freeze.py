"""Keep Python's cyclic garbage collector off the step loop's back.

A step allocates thousands of small objects (lists, dicts, the step's result), so the
collector runs several young-generation passes per step, and every so often a full pass
over every tracked object in the process: the model's modules, torch, transformers and
Triton's caches, several hundred thousand objects that a step never makes garbage of. That
full pass is a pause inside some step: hundreds of milliseconds a pass over a heap of
several hundred thousand objects, a few times a run; with the heap frozen the passes left
are small (`benchmarks/engine_core.py` counts them;
docs/decisions/0007-gc-freeze-during-generate.md).

`frozen_heap()` moves every object alive when a loop starts into the collector's permanent
generation for the loop's duration (`gc.freeze`), so the passes inside the loop look only at
what the loop itself allocated, and gives them back at the end (`gc.unfreeze`), so garbage
that forms later is collected as usual: nothing leaks past the loop. vLLM freezes the heap
once after start-up for the same reason; here it is scoped to the loop because a notebook
builds and drops engines in one process.

Inside the block the young generation's threshold is also raised, from Python's 700 to
YOUNG_THRESHOLD container allocations (restored at the end). A decode step at batch 256
allocates a few thousand containers (the step's scheduled requests, block-table copies,
outputs), most of them dead by the step's end; at 700 a young pass ran about once a step
over the step's live objects, host time inside steps whose pace is the host's (about 2% of
a nano-workload generate on the H200).
Passes 30x rarer find most of those objects freed already by reference counting; garbage
cycles wait at most that many allocations longer.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Iterator

YOUNG_THRESHOLD = 20_000     # young-generation threshold inside frozen_heap (module doc)


class FrozenHeap:
    """What `frozen_heap` yields: `refreeze()` moves what is alive now into the permanent
    generation too, for a bounded loop that admits work as it goes (replay.run_on_engine adds
    each request when it arrives), so its requests and records are frozen as LLM.generate's
    are, whose requests are all added before the freeze. The block's end unfreezes them with
    the rest. Not for an endless loop (the serving core): garbage cycles among refrozen
    objects wait for the end. A no-op when the block froze nothing (disabled, or gc off)."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def refreeze(self) -> None:
        if self.active:
            gc.freeze()


@contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[FrozenHeap]:
    """Freeze the heap while the block runs, and unfreeze it at the end.

    Unconditionally: a library may have frozen a few objects before (seen on the H200: 375
    frozen when generate started, so a version that left already-frozen heaps alone froze
    nothing and the full passes walked 470k objects). Unfreezing at the end also unfreezes
    those; freezing only changes how often objects are looked at, never what is collected
    eventually, so that costs nothing but their freeze's speed-up. The young generation's
    threshold is raised to YOUNG_THRESHOLD inside (never lowered) and restored at the end,
    unless it was changed meanwhile.
    Not reentrant: the first block to end unfreezes (a nested loop is not something the
    engine runs)."""
    if not enabled or not gc.isenabled():
        yield FrozenHeap(False)
        return
    thresholds = gc.get_threshold()
    raised = (max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    gc.freeze()
    gc.set_threshold(*raised)
    heap = FrozenHeap(True)
    try:
        yield heap
    finally:
        heap.active = False
        if gc.get_threshold() == raised:   # not if someone changed it since (another block that
            gc.set_threshold(*thresholds)  # overlaps this one: never leave it raised for good)
        gc.unfreeze()


class GcPauses:
    """Count the collector's passes while the block runs, and the seconds they took:
    `with GcPauses() as p: ...` then `p.by_generation` ({generation: [passes, seconds]}),
    `p.full` (passes over the oldest generation), `p.seconds`. A full pass is a pause inside
    some step; a benchmark reports these so a slow step can be told from a collector's pass."""

    def __init__(self) -> None:
        self.by_generation: dict[int, list] = {}   # generation -> [passes, seconds]
        self.longest = 0.0
        self._t0 = 0.0

    @property
    def full(self) -> int:
        return self.by_generation.get(2, [0])[0]

    @property
    def passes(self) -> int:
        return sum(n for n, _ in self.by_generation.values())

    @property
    def seconds(self) -> float:
        return sum(t for _, t in self.by_generation.values())

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        p = self.by_generation.setdefault(info.get("generation"), [0, 0.0])
        p[0] += 1
        p[1] += took
        self.longest = max(self.longest, took)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def as_dict(self) -> dict:
        return {"gc_passes": self.passes, "gc_full_passes": self.full, "gc_s": self.seconds,
                "gc_longest_s": self.longest}
