"""Sleep mode and weight updates on the engine's side (vLLM's names): which parts are asleep,
the idle rule, the prefix cache, the CUDA graphs; the ranks' memory work is worker/sleep.py's,
run on every rank through `Executor.call`.

    sleep(level)        level 1: weights to host memory, KV dropped; level 2: weights dropped
    wake_up(tags)       "weights" and / or "kv_cache" (None: both)
    update_weights(it)  (checkpoint name, tensor) pairs through model.load_weights, all or nothing
    reset_prefix_cache  every cached block forgotten (the KV it named is gone or stale)

Rules. Sleeping and updating need an idle engine (no request in flight, as vLLM requires): a
request's KV would be lost, or computed half with old weights. While anything is asleep,
adding or stepping a request raises and says what to wake. After a level-2 sleep the engine
refuses to generate until every weight has been given again (update_weights, possibly over
several calls): running a model of zeros is never what a caller wants.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from toolkit.models.weight_check import check_update
from toolkit.worker.sleep import (TAGS, check_rank, load_rank, restore_rank, sleep_rank, snapshot_rank,
                                  wake_rank)

log = logging.getLogger(__name__)


class EngineSleepingError(RuntimeError):
    """A request reached an engine that is asleep (or whose level-2 weights are not reloaded)."""


class SleepMode:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.enabled = False                 # EngineConfig.enable_sleep_mode (build_engine sets it)
        self.asleep: dict[str, int] = {}     # tag -> the level it sleeps at
        self.stale: set[tuple[str, int]] | None = None   # weights not given again since level 2
        self.freed_bytes = 0                 # device bytes the last sleep freed (every rank)
        self._graph_args: tuple | None = None

    def __repr__(self) -> str:
        if not self.asleep:
            state = "awake" + (f", {len(self.stale)} weights not reloaded" if self.stale else "")
        else:
            state = "asleep: " + ", ".join(f"{t} (level {lv})" for t, lv in self.asleep.items())
        return f"SleepMode({state}{'' if self.enabled else ', disabled'})"

    # -- queries --
    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def check_awake(self) -> None:
        """RuntimeError naming what is asleep (or the weights not reloaded after level 2)."""
        if self.asleep:
            parts = " and ".join(f"the {'KV cache' if t == 'kv_cache' else t} (level {lv})"
                                 for t, lv in self.asleep.items())
            tags = sorted(self.asleep)
            raise EngineSleepingError(f"the engine is asleep: {parts}; it cannot generate until it wakes: call "
                               f"wake_up() (or wake_up(tags={tags}))")
        if self.stale:
            some = sorted(self.stale)[:3]
            raise EngineSleepingError(f"sleep(level=2) discarded the weights and {len(self.stale)} of them have "
                               f"not been given again (e.g. {some}); call update_weights() with the "
                               "model's weights before generating")

    # -- sleep / wake --
    def sleep(self, level: int = 1) -> None:
        if not self.enabled:
            raise ValueError("sleep mode is off: build the engine with enable_sleep_mode=True "
                             "(LLM(..., enable_sleep_mode=True), serve --enable-sleep-mode)")
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"level must be 1 or 2, got {level!r}")
        if level not in (1, 2):
            raise ValueError(f"level must be 1 (weights to host memory) or 2 (weights discarded), got {level}")
        if level == 2:                               # its wake needs update_weights
            self._check_no_connector("sleep(level=2)")
        self._check_idle("sleep()")
        deeper = [t for t in TAGS if self.asleep.get(t, 0) < (level if t == "weights" else 1)]
        if not deeper:
            return
        engine, runner = self.engine, self.engine.runner
        executor = runner.executor
        executor.call(check_rank, deeper)            # nothing changes if a storage cannot be freed
        if "kv_cache" in deeper:
            self.reset_prefix_cache()                # its blocks' KV is about to be gone
        if runner.graphs is not None:                # they reference the memory: rebuilt on wake
            self._graph_args = getattr(runner, "graph_args", None)
        runner.graphs = runner.sample_graphs = None
        self.freed_bytes = sum(executor.call(sleep_rank, deeper, level))
        for t in deeper:
            self.asleep[t] = level if t == "weights" else 1
        if level == 2 and "weights" in deeper:
            self.stale = _expected(engine.model)
            _reset_host_tier(engine.scheduler)       # host KV of the old weights is stale too
        log.info("asleep at level %d: %s; %.1f MiB of device memory freed", level, deeper,
                 self.freed_bytes / 2**20)

    def wake_up(self, tags: Iterable[str] | str | None = None) -> None:
        tags = list(TAGS) if tags is None else [tags] if isinstance(tags, str) else list(tags)
        bad = [t for t in tags if t not in TAGS]
        if bad:
            raise ValueError(f"unknown wake_up tag(s) {bad}; valid tags: {list(TAGS)} (None: both)")
        todo = [t for t in TAGS if t in tags and t in self.asleep]
        if not todo:
            return
        runner = self.engine.runner
        runner.executor.call(wake_rank, todo)
        for t in todo:
            del self.asleep[t]
        if not self.asleep and self._graph_args is not None:
            # new addresses: new graphs, each bucket captured again at its first step
            runner.enable_cuda_graphs(*self._graph_args)
            self._graph_args = None
        log.info("woke %s%s", todo, f"; still asleep: {sorted(self.asleep)}" if self.asleep else "")

    # -- weights --
    def update_weights(self, weights: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> int:
        """Copy (checkpoint name, tensor) pairs into the model in place, on every rank (each
        layer's loader takes its rank's slice); returns how many tensors were given. The whole
        update is checked first: an unknown name or a wrong shape changes nothing."""
        if isinstance(weights, Mapping):
            weights = weights.items()
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
            raise TypeError(f"weights must be an iterable of (checkpoint name, tensor) pairs or a dict, "
                            f"got {type(weights).__name__}")
        if "weights" in self.asleep:
            raise RuntimeError("the weights are asleep; call wake_up(tags=['weights']) before "
                               "update_weights()")
        self._check_no_connector("update_weights()")
        self._check_idle("update_weights()")
        weights = list(weights)
        executor = self.engine.runner.executor
        checked = check_update(self.engine.model, weights)
        if not checked:                              # no way to check first: keep a rollback copy
            executor.call(snapshot_rank)
        try:
            loaded = executor.call(load_rank, weights)[0]
        except BaseException:
            if not checked:
                executor.call(restore_rank, True)
            raise
        if not checked:
            executor.call(restore_rank, False)
        self.reset_prefix_cache()
        _reset_host_tier(self.engine.scheduler)
        if self.stale is not None:
            self.stale -= loaded
            if not self.stale:
                self.stale = None
        log.info("updated %d weight tensors", len(weights))
        return len(weights)

    def _check_no_connector(self, what: str) -> None:
        """A KV connector's store names its blocks by the model's files, not its weights: after
        new weights it would hand back KV the old ones computed (and keep new KV under the old
        name for a later engine on the untouched folder)."""
        if getattr(self.engine.scheduler, "connector", None) is not None:
            raise ValueError(f"{what} is refused with a KV connector (kv_connector / kv_cache_dir): its "
                             "store keeps KV blocks under the model's name, which new weights do not "
                             "change; build the engine without one to update weights")

    # -- the prefix cache --
    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while requests hold blocks."""
        engine = self.engine
        if engine.has_unfinished():
            return False
        reset_prefix_cache(engine.allocator)
        return True

    def _check_idle(self, what: str) -> None:
        if self.engine.has_unfinished():
            ids = self.engine.request_ids()
            raise RuntimeError(f"{what} needs an idle engine, and {len(ids)} request(s) are in flight "
                               f"(e.g. {ids[:3]}); wait for them to finish or abort() them first "
                               "(vLLM has the same rule)")


def reset_prefix_cache(allocator: Any) -> None:
    """Empty an idle allocator's prefix cache through the BlockAllocator contract alone: take
    every free block (evicting every cached one), give them back. Eviction reports are off
    meanwhile (the host tier must not save blocks whose KV is gone)."""
    hook = getattr(allocator, "on_evict", None)
    if hook is not None:
        allocator.on_evict = None
    try:
        blocks = allocator.allocate(allocator.num_free_blocks())
        allocator.free(blocks[::-1])             # the lowest block handed out first again
    finally:
        if hook is not None:
            allocator.on_evict = hook
    cached = getattr(allocator, "num_cached_blocks", None)
    if cached is not None and cached():
        raise RuntimeError(f"{type(allocator).__name__} still caches {cached()} blocks after every "
                           "free block was taken; is a block held?")


def _reset_host_tier(scheduler: Any) -> None:
    """An idle host tier holds only cached entries: start it empty (their KV is stale)."""
    host = getattr(getattr(scheduler, "kv", None), "host", None)
    if host is not None and host.num_cached():
        host.__init__(host.num_slots)


def _expected(model: Any) -> set[tuple[str, int]] | None:
    """(parameter, shard) pairs a full load writes (load_weights' return value's form)."""
    expected = getattr(model, "expected_weights", None)
    if expected is None:
        return None
    return {(name, i) for name, n in expected().items() for i in range(n)}
