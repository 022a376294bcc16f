"""The KV-transfer tests' shapes (the tiny model, `tiny_llama_dir`, is the root conftest's)."""

from __future__ import annotations

# the tiny model's KV block: [layers, 2, block_size, kv heads, head_dim]
BS = 4
BLOCK_SHAPE = (2, 2, BS, 2, 16)
