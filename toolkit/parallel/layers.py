"""Tensor-parallel layers (Megatron's split, as vLLM has it), one rank's part of each.

    ColumnParallelLinear  y_r = x W_r^T: W's output rows split; its output stays split
                          (q/k/v heads, gate/up features). A merged layer (qkv, gate_up)
                          splits each of its parts on its own.
    RowParallelLinear     y = sum_r x_r W_r^T (+ b once): W's input columns split; the partial
                          products are all-reduced (attention's o_proj, the MLP's down_proj)
    VocabParallelEmbedding rows [start, stop) of the table; other ids give 0; all-reduced
    parallel_logits       each rank's vocabulary rows of the LM head, gathered to rank 0

`Slice` says which part of a full dimension a rank holds; every layer has `shard(full)`, the
rank's part of the unsharded layer's tensor (what the loader and the random init use).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.kernels.lm_head import lm_head_logits
from toolkit.models.llama import Linear, _matrix
from toolkit.parallel.group import Group


@dataclass(frozen=True)
class Slice:
    """Elements [start, start + size) of a dimension."""
    start: int
    size: int

    def of(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return t.narrow(dim, self.start, self.size)


def even_slice(n: int, rank: int, size: int) -> Slice:
    """Rank's equal share of n (n % size == 0, checked by sharding.check_tensor_parallel)."""
    per = n // size
    return Slice(rank * per, per)


def head_slice(num_heads: int, head_dim: int, rank: int, size: int) -> Slice:
    """Features of the heads a rank holds: heads split evenly, or, with fewer heads than
    ranks (GQA's KV heads), head rank // (size / num_heads) replicated on size / num_heads ranks."""
    if num_heads >= size:
        per = num_heads // size
        return Slice(rank * per * head_dim, per * head_dim)
    return Slice(rank // (size // num_heads) * head_dim, head_dim)


def vocab_slice(vocab_size: int, rank: int, size: int) -> tuple[Slice, int]:
    """(the real rows a rank holds, its padded row count): the vocabulary padded up to a
    multiple of size, so every rank holds as many rows (the padding rows are zero)."""
    per = -(-vocab_size // size)
    start = min(rank * per, vocab_size)
    return Slice(start, min(per, vocab_size - start)), per


class ColumnParallelLinear(Linear):
    """A rank's output rows of a (merged) linear layer. parts: (rows of that part in the full
    layer, the rank's slice of it), e.g. qkv: [(H*D, q heads), (Hkv*D, kv heads), (Hkv*D, ...)]."""

    def __init__(self, n_in: int, parts: list[tuple[int, Slice]], bias: bool, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(n_in, sum(s.size for _, s in parts), bias, dtype, device)
        self.parts = parts

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full layer's weight [out, in] or bias [out]."""
        pieces, offset = [], 0
        for rows, s in self.parts:
            pieces.append(full[offset + s.start: offset + s.start + s.size])
            offset += rows
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


class RowParallelLinear(Linear):
    """A rank's input columns of a linear layer; the output is the all-reduced sum over ranks.
    The bias is held whole on every rank and added by rank 0 only (once in the sum)."""

    def __init__(self, n_in_full: int, cols: Slice, n_out: int, bias: bool, group: Group,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(cols.size, n_out, bias, dtype, device)
        self.n_in_full, self.cols, self.group = n_in_full, cols, group

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """The rank's columns of the full weight [out, in]; a bias [out] whole."""
        return self.cols.of(full, 1) if full.dim() == 2 else full

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """x_r [T, in/N] -> this rank's term of the sum [T, out]."""
        return F.linear(x, self.weight, self.bias if self.group.rank == 0 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.partial(x))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, columns {self.cols.start}..{self.cols.start + self.cols.size} of {self.n_in_full}"


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + size) of the [V, hidden] table, padded to `per` rows; a token id
    outside them looks up 0, and the all-reduce over ranks leaves each id's row."""

    def __init__(self, vocab_size: int, hidden: int, group: Group, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.vocab_size, self.group = vocab_size, group
        self.rows, per = vocab_slice(vocab_size, group.rank, group.size)
        self.weight = _matrix(per, hidden, dtype, device)           # [V/N padded, hidden]

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full table [V, hidden], zero rows appended to `per`."""
        part = self.rows.of(full, 0)
        pad = self.weight.shape[0] - part.shape[0]
        return torch.cat([part, part.new_zeros(pad, *part.shape[1:])]) if pad else part

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.rows.start                                 # [T]
        outside = (local < 0) | (local >= self.rows.size)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)   # [T, hidden]
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return self.group.all_reduce(x)

    def extra_repr(self) -> str:
        return f"rows {self.rows.start}..{self.rows.start + self.rows.size} of {self.vocab_size}"


def parallel_logits(hidden: torch.Tensor, weight: torch.Tensor, group: Group, vocab_size: int,
                    dst: int = 0) -> torch.Tensor | None:
    """hidden [N, hidden] (the same on every rank) -> float32 logits [N, V] on rank dst (None
    elsewhere): each rank multiplies by its vocabulary rows [V/N padded, hidden], rank dst
    gathers the parts and drops the padding columns."""
    local = lm_head_logits(hidden, weight)                          # [N, V/N padded] float32
    parts = group.gather(local, dst)
    if parts is None:
        return None
    return torch.cat(parts, dim=-1)[:, :vocab_size]
