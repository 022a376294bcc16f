"""Logprobs of chosen tokens, their ranks and the top-k alternatives (batched, no host sync)."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_logprobs(logits: Tensor, token_ids: Tensor, k: int,
                    rows: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """logits float [N, V] (raw), token_ids int64 [N], k >= 0 ->
    (logprobs float32 [N, k+1], ids int64 [N, k+1], ranks int64 [N]).

    Column 0 is the given token, columns 1..k the k most likely tokens (k capped at V).
    rank = #{tokens whose logit >= the given token's} (1-based; vLLM's rule, so a tie shares
    the worse rank). Ranks and the top-k come from the logits themselves, not from rounded
    logprobs, so they are exact. Usable for prompt logprobs too (token_ids = the next token).
    rows int64 [R]: compute only these rows (the others get logprob NaN, id -1, rank 0).
    """
    if rows is not None:
        n, k = logits.shape[0], min(k, logits.shape[1])
        sub = gather_logprobs(logits.index_select(0, rows), token_ids.index_select(0, rows), k)
        full = (torch.full((n, k + 1), float("nan"), device=logits.device),
                torch.full((n, k + 1), -1, dtype=torch.int64, device=logits.device),
                torch.zeros(n, dtype=torch.int64, device=logits.device))
        return tuple(f.index_copy_(0, rows, s) for f, s in zip(full, sub))  # type: ignore[return-value]
    x = logits.to(torch.float32)
    m = x.amax(dim=-1, keepdim=True)                                      # [N, 1]
    lse = torch.logsumexp(x - m, dim=-1, keepdim=True)                    # as log_softmax rounds
    k = min(k, x.shape[1])
    ranks = (x >= x.gather(1, token_ids[:, None])).sum(dim=-1)            # [N]
    ids = token_ids[:, None]
    if k:
        ids = torch.cat([ids, x.topk(k, dim=-1).indices], dim=1)          # [N, k+1]
    return (x.gather(1, ids) - m) - lse, ids, ranks
