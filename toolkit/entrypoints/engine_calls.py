"""Engine methods as module-level functions, for `AsyncEngine.call` (a process core pickles
the function it runs in the engine's process: a bound method or a lambda would not)."""

from __future__ import annotations

from typing import Any


def sleep(engine: Any, level: int) -> None:
    engine.sleep(level)


def wake_up(engine: Any, tags: Any) -> None:
    engine.wake_up(tags)


def is_sleeping(engine: Any) -> bool:
    return engine.is_sleeping()


def update_weights(engine: Any, weights: Any) -> int:
    return engine.update_weights(weights)


def reset_prefix_cache(engine: Any) -> bool:
    return engine.reset_prefix_cache()
