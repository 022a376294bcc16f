"""What rank r of N holds of each checkpoint tensor, and which N a model allows.

Hugging Face names -> (dimension, Slice) of the full tensor: q_proj rows by query heads,
k_proj / v_proj rows by KV heads (replicated when there are fewer KV heads than ranks),
gate_proj / up_proj rows and down_proj columns by intermediate features, o_proj columns by
query heads, embed_tokens / lm_head rows by vocabulary; norms and row-parallel biases whole.
The loader reads only these slices (safetensors `get_slice`); the random init cuts them out
of the full tensors TP=1 would draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.parallel.layers import Slice, even_slice, head_slice, vocab_slice


def check_tensor_parallel(config: Any, size: int) -> None:
    """ValueError naming the dimension when the model cannot be split in `size`."""
    from toolkit.models.llama import Geometry

    g = Geometry(config)
    problems = []
    if g.num_heads % size:
        problems.append(f"num_attention_heads ({g.num_heads})")
    if g.num_kv_heads % size and size % g.num_kv_heads:
        problems.append(f"num_key_value_heads ({g.num_kv_heads}; or size a multiple of it: the KV "
                        "heads are then replicated)")
    if g.intermediate % size:
        problems.append(f"intermediate_size ({g.intermediate})")
    if problems:
        raise ValueError(f"tensor_parallel_size={size} must divide {', '.join(problems)}; valid sizes "
                         f"for this model: {valid_sizes(config)}")


def valid_sizes(config: Any, limit: int = 64) -> list[int]:
    from toolkit.models.llama import Geometry

    g = Geometry(config)
    return [n for n in range(1, limit + 1) if g.num_heads % n == 0 and g.intermediate % n == 0
            and (g.num_kv_heads % n == 0 or n % g.num_kv_heads == 0)]


@dataclass(frozen=True)
class TPShape:
    """The slices of rank `rank` of `size` for one model geometry."""
    rank: int
    size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab_size: int

    @classmethod
    def of(cls, geometry: Any, rank: int, size: int) -> "TPShape":
        g = geometry
        return cls(rank, size, g.num_heads, g.num_kv_heads, g.head_dim, g.intermediate, g.vocab_size)

    @property
    def q(self) -> Slice:
        return head_slice(self.num_heads, self.head_dim, self.rank, self.size)

    @property
    def kv(self) -> Slice:
        return head_slice(self.num_kv_heads, self.head_dim, self.rank, self.size)

    @property
    def local_kv_heads(self) -> int:
        return self.kv.size // self.head_dim

    @property
    def inter(self) -> Slice:
        return even_slice(self.intermediate, self.rank, self.size)

    @property
    def vocab(self) -> Slice:
        return vocab_slice(self.vocab_size, self.rank, self.size)[0]

    def slice_of(self, name: str, ndim: int) -> tuple[int, Slice] | None:
        """(dimension, slice) of checkpoint tensor `name` this rank holds; None = all of it."""
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if module == "q_proj":
            return 0, self.q
        if module in ("k_proj", "v_proj"):
            return 0, self.kv
        if module in ("gate_proj", "up_proj"):
            return 0, self.inter
        if module == "o_proj" and ndim == 2:
            return 1, self.q
        if module == "down_proj" and ndim == 2:
            return 1, self.inter
        if module in ("embed_tokens", "lm_head"):
            return 0, self.vocab
        return None                     # norms, row-parallel biases: whole on every rank
