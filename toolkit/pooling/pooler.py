"""Pooler: the finished prompts' hidden states (one ragged batch) -> one result per request.

    pool(hidden [T, H], lens [B], pooling_type) -> float32 [B, H]
        LAST: each prompt's last token; CLS: its first; MEAN: the mean over its own tokens
        (a segment sum: index_add_ of the rows by request, / length: no padding, no mask)
    Pooler(config, classifier)(hidden, lens, params) -> [result of request b]
        embed: pooled[:dimensions], L2-normalised (params.normalize, else config.normalize)
        classify: classifier(pooled) -> softmax probs [C] (use_activation=False: logits)
        score: the last class's probability ([1]); a one-class head: its sigmoid

The twin (same signatures) is toolkit.pooling.reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from toolkit.pooling.config import PoolerConfig
from toolkit.pooling.params import PoolingParams

NORM_EPS = 1e-12          # F.normalize's (and sentence-transformers' Normalize's) floor


def _ends(lens: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(lens, 0)                                          # [B]


def pool(hidden: torch.Tensor, lens: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """hidden [T, H] (prompts back to back, sum(lens) == T), lens int64 [B] >= 1 -> float32 [B, H]."""
    lens = lens.to(device=hidden.device, dtype=torch.long)
    ends = _ends(lens)                                                    # [B]
    if pooling_type == "LAST":
        return hidden.index_select(0, ends - 1).float()
    if pooling_type == "CLS":
        return hidden.index_select(0, ends - lens).float()
    if pooling_type == "MEAN":
        seg = torch.repeat_interleave(torch.arange(len(lens), device=hidden.device), lens)   # [T]
        sums = torch.zeros(len(lens), hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seg, hidden.float())                           # [B, H]
        return sums / lens.unsqueeze(1).float()
    raise ValueError(f"pooling_type must be one of LAST, MEAN, CLS, got {pooling_type!r}")


def task_of(p: PoolingParams) -> str:
    return p.task or "embed"


class Pooler:
    """The fast pooler (module doc). classifier: pooled hidden [N, H] (the model's dtype) ->
    logits [N, C]; None: the engine serves "embed" only."""

    def __init__(self, config: PoolerConfig, classifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config, self.classifier, self.dtype = config, classifier, dtype

    @property
    def tasks(self) -> tuple[str, ...]:
        return ("embed", "classify", "score") if self.classifier is not None else ("embed",)

    def __call__(self, hidden: torch.Tensor, lens: torch.Tensor,
                 params: Sequence[PoolingParams]) -> list[torch.Tensor]:
        pooled = pool(hidden, lens, self.config.pooling_type)              # [B, H]
        out: list[torch.Tensor | None] = [None] * len(params)
        embed = [b for b, p in enumerate(params) if task_of(p) == "embed"]
        heads = [b for b, p in enumerate(params) if task_of(p) != "embed"]
        if embed:
            x = pooled[embed]                                             # [E, H]
            full = [i for i, b in enumerate(embed) if params[b].dimensions is None]
            norm = torch.tensor([self._normalize(params[b]) for b in embed], device=x.device)
            y = torch.where(norm[:, None], F.normalize(x, dim=-1, eps=NORM_EPS), x)
            for i in full:
                out[embed[i]] = y[i]
            for i, b in enumerate(embed):
                if params[b].dimensions is not None:
                    v = x[i, : params[b].dimensions]
                    out[b] = F.normalize(v, dim=0, eps=NORM_EPS) if self._normalize(params[b]) else v
        if heads:
            if self.classifier is None:
                raise ValueError("this engine has no classifier head; it serves task 'embed' only")
            logits = self.classifier(pooled[heads].to(self.dtype)).float()  # [N, C]
            probs = torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=-1)
            for i, b in enumerate(heads):
                p = params[b]
                if task_of(p) == "score":
                    out[b] = probs[i, -1:]
                else:
                    out[b] = logits[i] if p.use_activation is False else probs[i]
        return out  # type: ignore[return-value]

    def _normalize(self, p: PoolingParams) -> bool:
        return self.config.normalize if p.normalize is None else p.normalize

    def __repr__(self) -> str:
        return (f"Pooler({self.config.pooling_type}, normalize={self.config.normalize}, "
                f"tasks={list(self.tasks)})")
