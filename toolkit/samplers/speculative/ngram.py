"""Prompt-lookup (n-gram) proposer: no model, drafts copied from the sequence itself.

For n = max_n down to min_n: find the most recent earlier occurrence of the last n tokens
in prompt + output, and propose the k tokens that followed it. When the occurrence is close
to the end, the continuation runs into the proposal itself: with shift s = (L - n) - i between
the occurrence at i and the suffix, the sequence is taken to repeat with period s, so token m
of the proposal is seq[i + n + m] for i + n + m < L and proposal[m - s] after (a loop such as
"a b a b" keeps proposing "a b ..."). No match -> no drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from toolkit.samplers.speculative.base import Draft, draft_budget
from toolkit.types import Request


class NgramProposer:
    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise ValueError(f"NgramProposer needs integers 1 <= min_n <= max_n, got min_n={min_n!r}, "
                             f"max_n={max_n!r}")
        self.min_n, self.max_n = min_n, max_n

    def __repr__(self) -> str:
        return f"NgramProposer(min_n={self.min_n}, max_n={self.max_n})"

    def remove(self, request_ids: Sequence[str]) -> None:
        """Stateless per request: nothing to drop."""

    def propose(self, requests: Sequence[Request], k: int) -> list[Draft]:
        return [Draft(self.lookup(r.all_token_ids, draft_budget(r, k))) for r in requests]

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k drafts continuing `tokens` (see the module docstring); [] when nothing matches."""
        if k <= 0:
            return []
        seq = np.asarray(tokens, dtype=np.int64)                      # [L]
        L = seq.shape[0]
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            # windows starting at i = 0 .. L-1-n: each ends before the last token, so the
            # suffix itself (which starts at L - n) is never its own match
            windows = sliding_window_view(seq[:L - 1], n)              # [L - n, n]
            hits = np.flatnonzero((windows == seq[L - n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n                              # first token after the match
                period = L - start                                     # >= 1
                idx = start + np.arange(k) % period                    # periodic past the end
                return seq[idx].tolist()
        return []
