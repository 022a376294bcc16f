"""Test-only: drive any Model (toolkit/models/base.py) through the paged KV cache from its
`spec` alone: one KVCache, one CPUAttention per group of alike layers (spec.attention_groups),
a per-layer router in front of them, and greedy decoding over ragged steps in which prompt
chunks and decode tokens of different sequences share a batch."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from toolkit.attention.cpu import CPUAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout


class LayerBackends:
    """One backend per group of alike layers; write_kv / run go to the layer's own."""

    def __init__(self, spec: Any, kv_cache: KVCache, backend: type = CPUAttention) -> None:
        self.by_layer: dict[int, Any] = {}
        self.backends = []
        for la, layers in spec.attention_groups().items():
            b = backend(kv_cache, spec.num_heads, spec.head_dim, scale=la.scale,
                        sliding_window=la.window, soft_cap=la.soft_cap)
            self.backends.append(b)
            self.by_layer.update(dict.fromkeys(layers, b))

    def plan(self, layout: PagedKVLayout) -> None:
        for b in self.backends:
            b.plan(layout)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.by_layer[layer].write_kv(layer, k, v)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.by_layer[layer].run(layer, q)


class SpecRunner:
    """Blocks handed out from a shuffled free list (neighbours are not adjacent in memory);
    unwritten cache slots are NaN, so a read of one poisons the output."""

    def __init__(self, model: Any, block_size: int = 4, num_blocks: int = 64, seed: int = 0) -> None:
        s = model.spec
        self.model, self.block_size = model, block_size
        self.kv_cache = KVCache(s.num_layers, num_blocks, block_size, s.num_kv_heads, s.head_dim,
                                dtype=s.dtype)
        for t in self.kv_cache.layers:
            t.fill_(float("nan"))
        self.attention = LayerBackends(s, self.kv_cache)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def step(self, tables: list[list[int]], chunks: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Sequence b gets chunks[b] at positions starts[b]...; -> float32 logits of each
        sequence's last new token [B, V]."""
        for table, toks, start in zip(tables, chunks, starts):
            while len(table) * self.block_size < start + len(toks):
                table.append(self.free.pop())
        q_lens = [len(c) for c in chunks]
        layout = PagedKVLayout.build(tables, [s + q for s, q in zip(starts, q_lens)], q_lens,
                                     self.block_size)
        self.attention.plan(layout)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int64)           # [T]
        pos = torch.tensor([p for s, q in zip(starts, q_lens) for p in range(s, s + q)],
                           dtype=torch.int64)                                            # [T]
        hidden = self.model.forward(ids, pos, self.attention)                            # [T, D]
        last = torch.tensor(q_lens).cumsum(0) - 1                                        # [B]
        return self.model.compute_logits(hidden[last])


def greedy_paged(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 chunk: int = 6, block_size: int = 4) -> list[list[int]]:
    """Greedy decoding, sequence b joining at step b: its prompt in chunks of at most `chunk`
    tokens, then one token a step, beside whatever the other sequences are doing."""
    runner = SpecRunner(model, block_size=block_size)
    tables: list[list[int]] = [[] for _ in prompts]
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)                     # tokens already in the cache
    out: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(o) < max_new_tokens for o in out):
        live = [b for b in range(len(prompts)) if b <= step and len(out[b]) < max_new_tokens]
        chunks = [seqs[b][done[b]:done[b] + chunk] for b in live]
        logits = runner.step([tables[b] for b in live], chunks, [done[b] for b in live])
        for j, b in enumerate(live):
            done[b] += len(chunks[j])
            if done[b] == len(seqs[b]):           # the prompt (or last token) is in: sample
                tok = int(logits[j].argmax())
                out[b].append(tok)
                seqs[b].append(tok)
        step += 1
    return out
