"""The worker's side of pooling requests: the hidden rows each one's pooling needs, kept
across the steps of a chunked prefill until its last chunk, then pooled together.

LAST keeps the last chunk's last row, CLS the first chunk's first row, MEAN every row (the
mean is taken over the whole prompt at the end, so chunking never changes the arithmetic's
inputs). A request restarts (start 0: recompute after preemption) with an empty record;
finished or aborted ids (SchedulerOutput.finished_ids) are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from toolkit.pooling.pooler import Pooler


@dataclass
class PoolChunk:
    """One pooling request's rows in this step's batch: hidden[offset : offset + n] are its
    positions [start, start + n); final: the chunk ends its prompt."""
    request: Any
    offset: int
    n: int
    start: int
    final: bool


class PoolingState:
    def __init__(self, pooler: Pooler) -> None:
        self.pooler = pooler
        self._rows: dict[str, list[torch.Tensor]] = {}     # request id -> kept rows [k, H] per chunk

    def drop(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._rows.pop(rid, None)

    def take(self, hidden: torch.Tensor, chunks: list[PoolChunk]) -> dict[str, torch.Tensor]:
        """Keep this step's rows of the pooling requests (hidden [T, H]); returns {request id:
        float32 result} of those whose prompt ended (their records dropped)."""
        kind = self.pooler.config.pooling_type
        done: list[PoolChunk] = []
        for c in chunks:
            rid = c.request.request_id
            if c.start == 0 or rid not in self._rows:
                self._rows[rid] = []
            if kind == "MEAN":
                keep = hidden[c.offset:c.offset + c.n]
            elif kind == "CLS":
                keep = hidden[c.offset:c.offset + 1] if c.start == 0 else None
            else:
                keep = hidden[c.offset + c.n - 1:c.offset + c.n] if c.final else None
            if keep is not None:
                self._rows[rid].append(keep.clone())
            if c.final:
                done.append(c)
        if not done:
            return {}
        rows = [torch.cat(self._rows.pop(c.request.request_id)) for c in done]
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        if kind == "MEAN":
            bad = [(c.request.request_id, len(r)) for c, r in zip(done, rows)
                   if len(r) != c.request.num_prompt_tokens]
            assert not bad, f"MEAN pooling lost prompt rows (prefix-cache hit?): {bad}"
        results = self.pooler(torch.cat(rows), lens, [c.request.pooling_params for c in done])
        return {c.request.request_id: r.detach().float().cpu() for c, r in zip(done, results)}

    def __len__(self) -> int:
        return len(self._rows)
