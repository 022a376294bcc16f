"""The AttentionBackend contract: plan once per step, write_kv and run once per layer.

A backend is built over a KVCache (one tensor [2, num_blocks, block_size, H_kv, D] per
layer) and the model's head geometry. `plan` receives the step's PagedKVLayout and
prepares whatever metadata every layer reuses; `write_kv` stores the new tokens' K/V
at `layout.slot_mapping`; `run` returns attention of the step's queries over the cache.

Declared capabilities, with their defaults (the engine reads them when it is assembled;
docs/interfaces.md): `supports_run_out = False` (True: `run(layer, q, out=)` writes into a
given [T, H, D] buffer, which CUDA graphs need), `supports_static_decode = False` (the
whole-forward decode graphs' fixed tables), `supports_fused_kv_write = False` (True:
`kv_target(layer, v) -> KVWrite` hands the model the layer's cache and slots, its rotary launch
stores the step's K/V there, and `kv_written(layer, k, v)` replaces `write_kv`), and
`warm_up(dtype)` (absent: nothing to compile).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from toolkit.blocks.layout import PagedKVLayout


@runtime_checkable
class AttentionBackend(Protocol):
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None     # attend to at most this many most recent tokens (incl. self)
    soft_cap: float | None         # logits -> soft_cap * tanh(logits / soft_cap)

    def plan(self, layout: PagedKVLayout) -> None: ...

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, H_kv, D] of this step's tokens, written at layout.slot_mapping."""

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D] -> out [T, H, D]; token i of sequence b attends causally to the
        first (kv_len[b] - q_len[b] + i + 1) tokens of b (within the sliding window)."""
