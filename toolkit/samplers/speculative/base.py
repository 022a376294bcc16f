"""The proposer contract: running requests -> up to k draft tokens each (+ their distribution)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from toolkit.types import Request


@dataclass
class Draft:
    """A request's draft: token_ids (possibly fewer than k, possibly none) and, when the
    proposer sampled them, probs float32 [len(token_ids), V] (row j = the distribution token j
    was drawn from). probs None = the drafts are deterministic (one-hot q)."""

    token_ids: list[int]
    probs: Tensor | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and (self.probs.dim() != 2 or self.probs.shape[0] != len(self.token_ids)):
            raise ValueError(f"Draft.probs must be [len(token_ids)={len(self.token_ids)}, V], "
                             f"got {list(self.probs.shape)}")


@runtime_checkable
class Proposer(Protocol):
    """Called once per step on the running requests (after their new tokens are appended);
    returns one Draft per request, in order. It reads prompt_token_ids + output_token_ids and
    never mutates a request."""

    def propose(self, requests: Sequence[Request], k: int) -> list[Draft]: ...

    def remove(self, request_ids: Sequence[str]) -> None:
        """These requests finished or were aborted: drop any state kept for them (a draft
        model's KV); a stateless proposer does nothing."""


def draft_budget(request: Request, k: int) -> int:
    """How many of k drafts a request can still use: a step emits at most drafts + 1 tokens,
    so drafts past max_tokens - 1 or max_model_len - 1 would be thrown away."""
    left = request.sampling_params.max_tokens - request.num_output_tokens - 1
    if request.max_model_len is not None:
        left = min(left, request.max_model_len - request.num_tokens - 1)
    return max(0, min(k, left))
