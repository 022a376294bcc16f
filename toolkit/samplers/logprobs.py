"""Logprobs of chosen tokens, their ranks and the top-k alternatives (batched, no host sync)."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_logprobs(logits: Tensor, token_ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """logits float [N, V] (raw), token_ids int64 [N], k >= 0 ->
    (logprobs float32 [N, k+1], ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V).
    rank = #{tokens whose logit >= the given token's} (1-based; vLLM's rule, so a tie shares
    the worse rank). Ranks and the top-k come from the logits themselves, not from rounded
    logprobs, so they are exact. Usable for prompt logprobs too (token_ids = the next token).
    """
    x = logits.to(torch.float32)
    lp = torch.log_softmax(x, dim=-1)                                     # [N, V]
    k = min(k, x.shape[1])
    ranks = (x >= x.gather(1, token_ids[:, None])).sum(dim=-1)            # [N]
    ids = token_ids[:, None]
    if k:
        ids = torch.cat([ids, x.topk(k, dim=-1).indices], dim=1)          # [N, k+1]
    return lp.gather(1, ids), ids, ranks
