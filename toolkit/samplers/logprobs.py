"""Logprobs of chosen tokens, their ranks and the top-k alternatives (batched, no host sync)."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_logprobs(logprobs: Tensor, token_ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """logprobs float [N, V], token_ids int64 [N], k >= 0 ->
    (values [N, k+1], ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V).
    rank = #{tokens whose logprob >= the given token's} (1-based; vLLM's rule, so a tie
    shares the worse rank). Usable for prompt logprobs too (token_ids = the next prompt token).
    """
    k = min(k, logprobs.shape[1])
    chosen = logprobs.gather(1, token_ids[:, None])                       # [N, 1]
    ranks = (logprobs >= chosen).sum(dim=-1)                              # [N]
    if k == 0:
        return chosen, token_ids[:, None], ranks
    top = logprobs.topk(k, dim=-1)
    return (torch.cat([chosen, top.values], dim=1),
            torch.cat([token_ids[:, None], top.indices], dim=1), ranks)
