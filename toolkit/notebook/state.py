"""The live view's model: what it shows after each engine step, as plain values.

`LiveModel.update(record)` folds one StepRecord (and a look at the allocator) into a
frozen `LiveState`; the widget only renders states (render.py). Tests check the states.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from toolkit.engine.observe import StepRecord

MAX_CELLS = 1024       # block-map cells at most; a bigger cache shows groups of blocks per cell
_STATE_ORDER = ("free", "evictable", "held", "cached", "shared")


@dataclass(frozen=True)
class LiveState:
    step: int                          # the last step's number (0-based); -1 before any
    elapsed_s: float                   # since the first step began
    tokens_per_s: float                # prefill + decode tokens over elapsed_s
    num_tokens: int                    # over the run
    num_running: int
    num_waiting: int
    num_preempted: int                 # over the run
    num_finished: int                  # over the run
    kv_blocks_used: int
    kv_blocks_cached: int
    kv_blocks_total: int
    timeline: tuple[tuple[int, int, int], ...]   # (step, prefill, decode) of the last `window` steps
    blocks_per_cell: int               # 1, or the group size of a big cache
    block_cells: tuple[str, ...] | None = None   # a state per cell (render.COLORS' names); None: not looked
    block_owners: tuple[tuple[int, str], ...] = ()  # (block id, sequence ids holding it), one block a cell


def block_cells(allocator: Any, max_cells: int = MAX_CELLS) -> tuple[int, tuple[str, ...]]:
    """(blocks per cell, each cell's state): the allocator's block states, grouped so that at
    most max_cells cells remain; a group shows its most frequent state (ties: the busier)."""
    from toolkit.blocks.render import block_states

    states = [s for s, _ in block_states(allocator)]
    per = max(1, math.ceil(len(states) / max_cells))
    if per == 1:
        return 1, tuple(states)
    cells = []
    for i in range(0, len(states), per):
        counts = Counter(states[i:i + per])
        cells.append(max(counts, key=lambda s: (counts[s], _STATE_ORDER.index(s))))
    return per, tuple(cells)


class LiveModel:
    """Folds step records into LiveStates."""

    def __init__(self, allocator: Any = None, window: int = 120, scheduler: Any = None) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1 (steps on the timeline), got {window!r}")
        self.allocator = allocator
        self.scheduler = scheduler          # its running / waiting requests name the blocks' holders
        self.timeline: deque[tuple[int, int, int]] = deque(maxlen=window)
        self.start: float | None = None
        self.tokens = self.preempted = self.finished = 0
        self.state = LiveState(-1, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, (), 1, None)

    def update(self, rec: StepRecord, look_at_blocks: bool = True) -> LiveState:
        """The state after this step; `look_at_blocks` False skips the block map (cheap update)."""
        if self.start is None:
            self.start = rec.start_time
        self.tokens += rec.num_tokens
        self.preempted += rec.num_preempted
        self.finished += rec.num_finished
        self.timeline.append((rec.step, rec.num_prefill_tokens, rec.num_decode_tokens))
        elapsed = rec.start_time + rec.duration - self.start
        per, cells, owners = 1, None, ()
        if look_at_blocks and self.allocator is not None:
            per, cells = block_cells(self.allocator)
            owners = self._owners() if per == 1 else ()
        self.state = LiveState(
            rec.step, elapsed, self.tokens / elapsed if elapsed > 0 else 0.0, self.tokens,
            rec.num_running, rec.num_waiting, self.preempted, self.finished, rec.kv_blocks_used,
            rec.kv_blocks_cached, rec.kv_blocks_total, tuple(self.timeline), per, cells, owners)
        return self.state

    def _owners(self) -> tuple[tuple[int, str], ...]:
        """(block id, "seq, seq") for each block a live request of the scheduler holds."""
        by_block: dict[int, list[str]] = {}
        for q in ("running", "waiting"):
            for req in getattr(self.scheduler, q, ()):
                for b in getattr(req, "block_ids", ()):
                    by_block.setdefault(b, []).append(req.request_id)
        return tuple((b, ", ".join(ids)) for b, ids in sorted(by_block.items()))

    def update_blocks(self) -> LiveState:
        """The current state with the block map looked at now (the last frame of a run)."""
        import dataclasses

        if self.allocator is not None:
            per, cells = block_cells(self.allocator)
            self.state = dataclasses.replace(self.state, blocks_per_cell=per, block_cells=cells,
                                             block_owners=self._owners() if per == 1 else ())
        return self.state
