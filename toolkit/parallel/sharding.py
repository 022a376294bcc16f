"""Which tensor-parallel sizes a model allows (the layers say which slice each rank holds:
toolkit/models/layers/parallel.py)."""

from __future__ import annotations

from typing import Any


def _dims(config: Any) -> tuple[int, int, int]:
    """(query heads, KV heads, intermediate size) of a Hugging Face config."""
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads, config.intermediate_size


def check_tensor_parallel(config: Any, size: int) -> None:
    """ValueError naming the dimension when the model cannot be split in `size`."""
    heads, kv_heads, inter = _dims(config)
    problems = []
    if heads % size:
        problems.append(f"num_attention_heads ({heads})")
    if kv_heads % size and size % kv_heads:
        problems.append(f"num_key_value_heads ({kv_heads}; or size a multiple of it: the KV "
                        "heads are then replicated)")
    if inter % size:
        problems.append(f"intermediate_size ({inter})")
    if problems:
        raise ValueError(f"tensor_parallel_size={size} must divide {', '.join(problems)}; valid sizes "
                         f"for this model: {valid_sizes(config)}")


def valid_sizes(config: Any, limit: int = 64) -> list[int]:
    heads, kv_heads, inter = _dims(config)
    return [n for n in range(1, limit + 1) if heads % n == 0 and inter % n == 0
            and (kv_heads % n == 0 or n % kv_heads == 0)]
