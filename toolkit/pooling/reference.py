"""The pooler's reference twin: one request at a time, obviously correct (toolkit.pooling.pooler)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from toolkit.pooling.config import PoolerConfig
from toolkit.pooling.params import PoolingParams


def pool(hidden: torch.Tensor, lens: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """hidden [T, H], lens [B] -> float32 [B, H], a slice per request."""
    rows, start = [], 0
    for n in lens.tolist():
        seg = hidden[start:start + n].float()                             # [n, H]
        if pooling_type not in ("LAST", "CLS", "MEAN"):
            raise ValueError(f"pooling_type must be one of LAST, MEAN, CLS, got {pooling_type!r}")
        rows.append(seg[-1] if pooling_type == "LAST" else seg[0] if pooling_type == "CLS" else seg.sum(0) / n)
        start += n
    return torch.stack(rows) if rows else hidden.new_zeros(0, hidden.shape[1], dtype=torch.float32)


def _l2(v: torch.Tensor) -> torch.Tensor:
    return v / torch.clamp(torch.sqrt((v * v).sum()), min=1e-12)


class ReferencePooler:
    def __init__(self, config: PoolerConfig, classifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config, self.classifier, self.dtype = config, classifier, dtype

    def __call__(self, hidden: torch.Tensor, lens: torch.Tensor,
                 params: Sequence[PoolingParams]) -> list[torch.Tensor]:
        pooled = pool(hidden, lens, self.config.pooling_type)
        out = []
        for b, p in enumerate(params):
            task = p.task or "embed"
            if task == "embed":
                v = pooled[b] if p.dimensions is None else pooled[b, : p.dimensions]
                norm = self.config.normalize if p.normalize is None else p.normalize
                out.append(_l2(v) if norm else v)
                continue
            logits = self.classifier(pooled[b:b + 1].to(self.dtype)).float()[0]   # [C]
            if len(logits) == 1:
                probs = 1 / (1 + torch.exp(-logits))
            else:
                e = torch.exp(logits - logits.max())
                probs = e / e.sum()
            out.append(probs[-1:] if task == "score" else (logits if p.use_activation is False else probs))
        return out
