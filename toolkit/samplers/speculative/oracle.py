"""Oracle proposer for benchmarks: knows each prompt's future greedy tokens and proposes the
right one at each draft position with probability `acceptance_rate` (independently per
position), else a wrong token. With greedy verification this sets the acceptance rate, so a
benchmark measures the machinery (random weights make a real draft's acceptance meaningless).

futures: prompt token ids (as a tuple) -> the target's greedy output for that prompt, e.g.
recorded by a run with speculation off. A request whose output has left its recorded future
(numerics differ between the runs) gets no drafts; `num_misaligned` counts those calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from toolkit.samplers.speculative.base import Draft, draft_budget
from toolkit.types import Request


class OracleProposer:
    def __init__(self, futures: Mapping[tuple[int, ...], Sequence[int]], acceptance_rate: float,
                 seed: int = 0) -> None:
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {acceptance_rate}")
        self.futures = {tuple(k): list(v) for k, v in futures.items()}
        self.acceptance_rate = acceptance_rate
        self.rng = np.random.default_rng(seed)
        self.num_misaligned = 0

    def __repr__(self) -> str:
        return f"OracleProposer(acceptance_rate={self.acceptance_rate}, prompts={len(self.futures)})"

    def remove(self, request_ids: Sequence[str]) -> None:
        """Stateless per request: nothing to drop."""

    def propose(self, requests: Sequence[Request], k: int) -> list[Draft]:
        return [Draft(self._one(r, draft_budget(r, k))) for r in requests]

    def _one(self, r: Request, k: int) -> list[int]:
        future = self.futures.get(tuple(r.prompt_token_ids))
        if future is None:
            raise ValueError(f"OracleProposer has no recorded future for request {r.request_id!r} "
                             f"(prompt of {r.num_prompt_tokens} tokens)")
        n = r.num_output_tokens
        if future[:n] != r.output_token_ids:
            self.num_misaligned += 1
            return []
        right = np.asarray(future[n:n + k], dtype=np.int64)            # [<= k]
        wrong = np.where(right > 0, right - 1, right + 1)
        hit = self.rng.random(right.shape[0]) < self.acceptance_rate
        return np.where(hit, right, wrong).tolist()
