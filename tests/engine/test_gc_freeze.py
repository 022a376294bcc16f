"""engine/gc_freeze.frozen_heap: what is alive when the loop starts is out of the collector's
passes during the loop, and collectable again afterwards (nothing leaks past the loop)."""

from __future__ import annotations

import gc
import weakref

from toolkit.engine.gc_freeze import FrozenHeap, frozen_heap


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


def test_refreeze_takes_in_what_came_later_and_the_end_gives_it_back() -> None:
    with frozen_heap() as heap:
        at_start = gc.get_freeze_count()
        node = _Node()
        ref = weakref.ref(node)
        later = [[] for _ in range(100)]
        heap.refreeze()
        assert gc.get_freeze_count() >= at_start + 101
        del node
        gc.collect()
        assert ref() is not None              # refrozen: a full pass skips it too
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None
    del later


def test_refreeze_outside_a_frozen_heap_does_nothing() -> None:
    """Not after the block, nor from a block that froze nothing, even where a library froze
    a few objects of its own (the count alone does not tell a frozen_heap block)."""
    with frozen_heap() as heap:
        pass
    heap.refreeze()
    assert gc.get_freeze_count() == 0
    gc.freeze()                               # a library's own freeze
    try:
        few = gc.get_freeze_count()
        junk = [[] for _ in range(100)]
        with frozen_heap(enabled=False) as off:
            off.refreeze()
            assert gc.get_freeze_count() == few
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


def test_gc_pauses_counts_passes_and_only_inside() -> None:
    from toolkit.engine.gc_freeze import GcPauses

    with GcPauses() as p:
        gc.collect()                          # one full pass
        gc.collect(0)                         # one young pass
    assert p.full == 1 and p.passes == 2
    assert p.seconds >= p.longest > 0.0
    gc.collect()                              # after the block: not counted, callback gone
    assert p.passes == 2
    d = p.as_dict()
    assert d["gc_full_passes"] == 1 and d["gc_passes"] == 2


def _run_tiny(monkeypatch, trace, before_step, **run_kw):
    """run_on_engine on a 1-layer random Llama (CPU), before_step() called before every step."""
    from transformers import LlamaConfig

    from toolkit import LLM
    from toolkit.simulator.replay import run_on_engine

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=128, max_position_embeddings=1024)
    with LLM(cfg, device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4) as llm:
        step = llm.engine.step
        monkeypatch.setattr(llm.engine, "step", lambda: (before_step(), step())[1])
        return run_on_engine(llm, trace, **run_kw)


def test_run_on_engine_runs_with_the_heap_frozen(monkeypatch) -> None:
    """The simulator's real runs step the engine as LLM.generate does: heap frozen, passes counted."""
    from toolkit.simulator import make_trace

    seen, refrozen = [], []
    monkeypatch.setattr(FrozenHeap, "refreeze", lambda self: refrozen.append(len(seen)))
    run = _run_tiny(monkeypatch, make_trace([(8, 3), (5, 2)], rate=1e9, vocab_size=128, seed=1),
                    lambda: seen.append(gc.get_freeze_count()), realtime=False)
    assert refrozen == [0]                    # once, after the admissions before the first step
    assert seen and min(seen) > 1000          # frozen at every step
    assert gc.get_freeze_count() == 0         # and given back
    assert {"gc_passes", "gc_full_passes", "gc_s"} <= set(run.host_time)


def test_run_on_engine_refreezes_as_requests_arrive_and_every_256_steps(monkeypatch) -> None:
    from toolkit.simulator import make_trace

    steps, refrozen = [], []
    monkeypatch.setattr(FrozenHeap, "refreeze", lambda self: refrozen.append(len(steps)))
    trace = make_trace([(8, 600), (5, 2)], rate=1e9, vocab_size=128, seed=1)
    trace.requests[1].arrival = 0.3           # arrives while the first is decoding
    _run_tiny(monkeypatch, trace, lambda: steps.append(1))
    assert refrozen[0] == 0 and len(steps) > 512, (refrozen, len(steps))
    gaps = [b - a for a, b in zip(refrozen, refrozen[1:])]
    assert any(g < 256 for g in gaps), refrozen       # the later arrival's admission
    assert 256 in gaps and max(gaps) == 256, refrozen    # and every 256 steps since the last


def test_young_passes_rarer_inside_and_thresholds_restored_after() -> None:
    from toolkit.engine.gc_freeze import YOUNG_THRESHOLD

    before = gc.get_threshold()
    with frozen_heap():
        assert gc.get_threshold() == (max(before[0], YOUNG_THRESHOLD), *before[1:])
        with GcPassCounter() as passes:
            junk = [[] for _ in range(YOUNG_THRESHOLD // 2)]     # tracked containers
        assert passes.young == 0
        del junk
    assert gc.get_threshold() == before
    with GcPassCounter() as passes:
        junk = [[] for _ in range(YOUNG_THRESHOLD // 2)]
    assert passes.young > 0                                      # the default 700 again
    del junk


class GcPassCounter:
    def __init__(self) -> None:
        self.young = 0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 0:
            self.young += 1

    def __enter__(self) -> "GcPassCounter":
        gc.collect()
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)


def test_overlapping_blocks_never_leave_the_threshold_raised() -> None:
    """Two loops in one process (a server's engine thread and a generate) whose blocks end in
    the order they began: the second restores what it saw, the raised value, but the first has
    put the original back by then, so nothing is left raised once both end."""
    before = gc.get_threshold()
    first, second = frozen_heap(), frozen_heap()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold() == before
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before


def test_run_on_engine_shows_its_progress_in_output_tokens(monkeypatch) -> None:
    """A long run_on_engine is not silent (issue 54 item 10): a bar over the trace's output
    tokens, advanced once a step by the tokens that step delivered; use_tqdm=False: none."""
    import contextlib

    import toolkit.simulator.replay as replay
    from toolkit.simulator import make_trace

    bars = []

    class _Bar:
        def __init__(self, total, enabled):
            self.total, self.enabled, self.done, self.calls = total, enabled, 0, 0

        def update(self, n=1):
            self.done, self.calls = self.done + n, self.calls + 1

    @contextlib.contextmanager
    def fake(total, enabled=True, desc="", unit="it"):
        bars.append(_Bar(total, enabled))
        yield bars[-1]

    monkeypatch.setattr(replay, "progress_bar", fake)
    trace = make_trace([(8, 3), (5, 2), (6, 4)], rate=1e9, vocab_size=128, seed=1)
    run = _run_tiny(monkeypatch, trace, lambda: None, realtime=False)
    (bar,) = bars
    assert bar.enabled and bar.total == bar.done == 9 == sum(len(t.token_times) for t in run.requests.values())
    assert 1 <= bar.calls <= len(run.steps)
    _run_tiny(monkeypatch, trace, lambda: None, realtime=False, use_tqdm=False)
    assert not bars[-1].enabled
