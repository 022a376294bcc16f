"""What pooling needs of every tensor-parallel rank, run through `Executor.call` (fn(ModelRunner,
*args) on each rank at once; on the one rank at TP=1): module-level functions, so a worker
process can unpickle them.

    set_sep_token_id(runner, id)     an encoder's text-pair separator: every rank embeds the
                                     token types (each its rows of the table), so all must agree
    rank_logits(runner, hidden)      model.compute_logits on this rank: the LM head's vocabulary
                                     parts, gathered to rank 0 (None on the others)
    executor_logits(executor, h)     that on every rank together: float32 [N, V] on rank 0; the
                                     classifier_from_token head's logits (the Pooler runs in rank
                                     0's process, the LM head is split over the ranks)
"""

from __future__ import annotations

from typing import Any

import torch


def set_sep_token_id(runner: Any, token_id: int | None) -> None:
    runner.model.sep_token_id = token_id


def rank_logits(runner: Any, hidden: torch.Tensor) -> torch.Tensor | None:
    """hidden [N, H] (the same on every rank) -> float32 [N, V] on rank 0, None elsewhere."""
    return runner.model.compute_logits(hidden.to(runner.device))


def executor_logits(executor: Any, hidden: torch.Tensor) -> torch.Tensor:
    """model.compute_logits(hidden [N, H]) with every rank's part of the LM head: float32 [N, V]
    on hidden's device. The workers get hidden through their pipes (host memory), then join the
    LM head's gather; at TP=1 it is the model's own call."""
    x = hidden if getattr(executor, "local_lm_head", True) else hidden.detach().cpu()
    return executor.call(rank_logits, x)[0].to(hidden.device)
