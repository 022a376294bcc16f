"""The token embedding and the LM head, split over ranks by vocabulary rows.

VocabParallelEmbedding holds rows [start, start + size) of the [V, D] table, padded to V / N
rows (rounded up); an id outside them looks up 0 and the all-reduce leaves each id's row.
`logits` multiplies by a rank's rows and gathers the parts to rank 0. At TP=1 both are the
plain embedding and one GEMM.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.models.layers.linear import matrix, mark
from toolkit.models.layers.parallel import shape_of, single_process, take, vocab_slice


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, *, dtype: torch.dtype, device: torch.device | str,
                 group: Any = None) -> None:
        super().__init__()
        self.group = group if group is not None else single_process()
        self.vocab_size, self.hidden = vocab_size, hidden
        self.rows, per = vocab_slice(vocab_size, self.group.rank, self.group.size)
        self.weight = mark(matrix(per, hidden, dtype, torch.device(device)), self.weight_loader,
                           [(None, (vocab_size, hidden))], "normal")          # [V/N padded, D]

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shape_of(loaded) != (self.vocab_size, self.hidden):
            raise ValueError(f"shape mismatch for the embedding: checkpoint has {shape_of(loaded)}, "
                             f"the model expects {(self.vocab_size, self.hidden)}")
        param.data[: self.rows.size].copy_(take(loaded, 0, self.rows))
        param.data[self.rows.size:].zero_()                                 # padding rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 [T] -> [T, D]."""
        if self.group.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.rows.start                                       # [T]
        outside = (local < 0) | (local >= self.rows.size)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)         # [T, D]
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return self.group.all_reduce(x)

    def logits(self, hidden: torch.Tensor, lm_head: Callable[..., torch.Tensor]) -> torch.Tensor | None:
        """hidden [N, D] (the same on every rank) -> float32 logits [N, V] on rank 0 (None on
        the others); lm_head(hidden, weight) is the model's ops.lm_head_logits."""
        local = lm_head(hidden, self.weight)                                # [N, V/N padded]
        if self.group.size == 1:
            return local
        parts = self.group.gather(local, 0)
        return None if parts is None else torch.cat(parts, dim=-1)[:, : self.vocab_size]

    def extra_repr(self) -> str:
        return f"rows {self.rows.start}..{self.rows.start + self.rows.size} of {self.vocab_size}, dim={self.hidden}"


ParallelLMHead = VocabParallelEmbedding   # an untied head is the same split of a [V, D] matrix
