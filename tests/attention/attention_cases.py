"""Shared builders for the attention tests: random ragged paged layouts over a shuffled cache,
hypothesis strategies for them, and the relative-error check (NaN never passes)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REL_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


@dataclass
class Case:
    cache: KVCache
    layout: PagedKVLayout
    q: torch.Tensor            # [T, H, D]
    tables: list[list[int]]    # logical -> physical block of each sequence
    kv_lens: list[int]
    q_lens: list[int]


def make_case(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, kv_lens: list[int],
              q_lens: list[int], dtype: torch.dtype, seed: int = 0, spare_blocks: int = 3,
              num_layers: int = 1) -> Case:
    """Random (never zero) K/V in a cache whose blocks are handed out in shuffled order, so every
    sequence's block table is non-contiguous; last blocks are partly filled when kv_len says so."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in kv_lens]
    num_blocks = sum(needed) + spare_blocks
    cache = KVCache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, DEVICE)
    for layer in cache.layers:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(dtype))
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables, i = [], 0
    for n in needed:
        tables.append(ids[i:i + n])
        i += n
    layout = PagedKVLayout.build(tables, kv_lens, q_lens, block_size, device=DEVICE)
    q = torch.randn(layout.num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    return Case(cache, layout, q, tables, kv_lens, q_lens)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert not actual.isnan().any(), "NaN in the output (an element left unwritten?)"
    a, e = actual.double(), expected.double()
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def poisoned_like(q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, float("nan"))


@st.composite
def ragged_lengths(draw: st.DrawFn, max_seqs: int = 4, max_kv: int = 150
                   ) -> tuple[list[int], list[int]]:
    """(kv_lens, q_lens): decode rows (q=1), whole prompts (q=kv), chunks after a prefix."""
    n = draw(st.integers(1, max_seqs))
    kv_lens, q_lens = [], []
    for _ in range(n):
        kv = draw(st.one_of(st.just(1), st.integers(1, max_kv)))
        kind = draw(st.sampled_from(["decode", "prompt", "chunk"]))
        q = 1 if kind == "decode" else kv if kind == "prompt" else draw(st.integers(1, kv))
        kv_lens.append(kv)
        q_lens.append(q)
    return kv_lens, q_lens


@st.composite
def head_geometry(draw: st.DrawFn, head_dims: tuple[int, ...] = (32, 64, 80, 96)
                  ) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim): MHA, GQA (also non-power-of-two groups) and MQA."""
    h_kv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    return h_kv * group, h_kv, draw(st.sampled_from(head_dims))
