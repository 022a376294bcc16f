"""Which part of a full tensor one tensor-parallel rank holds, and how to read just that part.

`Slice` names elements [start, start + size) of one dimension. A layer says which slice of
each checkpoint tensor its rank keeps (Megatron's split, as vLLM has it); `take` reads that
slice from a torch tensor or from a safetensors slice handle (which reads only those bytes).
`single_process()` is the group of one rank that TP=1 runs with: the same layer code, whose
collectives are then no-ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Slice:
    """Elements [start, start + size) of a dimension."""
    start: int
    size: int

    def of(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return t.narrow(dim, self.start, self.size)

    def shifted(self, offset: int) -> "Slice":
        return Slice(self.start + offset, self.size)


def even_slice(n: int, rank: int, size: int) -> Slice:
    """Rank's equal share of n (n % size == 0: the model checks it when built)."""
    if n % size:
        raise ValueError(f"{n} features cannot be split evenly over {size} ranks")
    per = n // size
    return Slice(rank * per, per)


def head_slice(num_heads: int, head_dim: int, rank: int, size: int) -> Slice:
    """Features of the heads a rank holds: heads split evenly, or, with fewer heads than
    ranks (GQA's KV heads), head rank // (size / num_heads) replicated on size / num_heads ranks."""
    if num_heads >= size:
        if num_heads % size:
            raise ValueError(f"{num_heads} heads cannot be split evenly over {size} ranks")
        per = num_heads // size
        return Slice(rank * per * head_dim, per * head_dim)
    if size % num_heads:
        raise ValueError(f"{size} ranks cannot share {num_heads} heads evenly")
    return Slice(rank // (size // num_heads) * head_dim, head_dim)


def vocab_slice(vocab_size: int, rank: int, size: int) -> tuple[Slice, int]:
    """(the real rows a rank holds, its padded row count): the vocabulary padded up to a
    multiple of size, so every rank holds as many rows (the padding rows are zero)."""
    per = -(-vocab_size // size)
    start = min(rank * per, vocab_size)
    return Slice(start, min(per, vocab_size - start)), per


def shape_of(loaded: Any) -> tuple[int, ...]:
    """The full shape of a checkpoint tensor or safetensors slice handle."""
    return tuple(loaded.get_shape()) if hasattr(loaded, "get_shape") else tuple(loaded.shape)


def take(loaded: Any, dim: int | None = None, s: Slice | None = None) -> torch.Tensor:
    """The slice s of dimension dim of a checkpoint tensor (all of it for s=None). A
    safetensors slice handle reads only the slice's bytes."""
    if hasattr(loaded, "get_shape"):
        if s is None:
            return loaded[:]
        index = [slice(None)] * len(loaded.get_shape())
        index[dim] = slice(s.start, s.start + s.size)
        return loaded[tuple(index)]
    return loaded if s is None else loaded.narrow(dim, s.start, s.size)


class SingleProcess:
    """The group of one rank (TP=1): collectives return their input."""
    rank, size, backend = 0, 1, "none"

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather(self, t: torch.Tensor, dst: int = 0) -> list[torch.Tensor]:
        return [t]

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        return t

    def __repr__(self) -> str:
        return "SingleProcess()"


def single_process() -> SingleProcess:
    return SingleProcess()
