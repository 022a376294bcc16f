"""Speculative-decoding counters, per request and overall.

One verification step of a request with k drafts emits accepted + 1 tokens (the accepted
drafts, then a recovered or bonus token). Definitions:
  acceptance_rate     = accepted / drafted
  mean_accepted_length = emitted / steps = 1 + accepted / steps   (tokens per verification step)
Steps with k = 0 (nothing drafted) count as steps that emit one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class SpecCounts:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    # accepted_at[j]: steps whose draft j was accepted (acceptance by position)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def emitted(self) -> int:
        return self.accepted + self.steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def add(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        if accepted > len(self.accepted_at):
            self.accepted_at.extend([0] * (accepted - len(self.accepted_at)))
        for j in range(accepted):
            self.accepted_at[j] += 1

    def as_dict(self) -> dict[str, float]:
        return dict(steps=self.steps, drafted=self.drafted, accepted=self.accepted,
                    emitted=self.emitted, acceptance_rate=self.acceptance_rate,
                    mean_accepted_length=self.mean_accepted_length)


class SpecDecodeStats:
    """Counters of a run: `total` and `per_request[request_id]`."""

    def __init__(self) -> None:
        self.total = SpecCounts()
        self.per_request: dict[str, SpecCounts] = {}

    def observe(self, request_ids: Sequence[str], num_draft_tokens: Sequence[int],
                num_emitted: Sequence[int]) -> None:
        """One step's outcome, host lists in batch order (num_emitted = accepted + 1; a request
        whose emitted tokens were cut by a stop still counts what the verifier accepted)."""
        if not len(request_ids) == len(num_draft_tokens) == len(num_emitted):
            raise ValueError(f"request_ids, num_draft_tokens and num_emitted need one entry per "
                             f"request; got {len(request_ids)}, {len(num_draft_tokens)}, "
                             f"{len(num_emitted)}")
        for rid, k, n in zip(request_ids, num_draft_tokens, num_emitted):
            self.total.add(k, n - 1)
            self.per_request.setdefault(rid, SpecCounts()).add(k, n - 1)

    def pop(self, request_id: str) -> SpecCounts | None:
        """Forget a finished request, returning its counters."""
        return self.per_request.pop(request_id, None)

    def __repr__(self) -> str:
        t = self.total
        return (f"SpecDecodeStats(steps={t.steps}, drafted={t.drafted}, accepted={t.accepted}, "
                f"acceptance_rate={t.acceptance_rate:.3f}, "
                f"mean_accepted_length={t.mean_accepted_length:.3f}, requests={len(self.per_request)})")
