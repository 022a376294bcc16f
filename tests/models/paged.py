"""Test-only helpers: run a model on a ragged batch through the paged KV cache, and greedy-decode.

Blocks are handed out naively (each sequence gets consecutive fresh blocks, in a shuffled
order so neighbours are not adjacent in memory); the real engine is elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial

import torch

from toolkit.attention.layerwise import build_attention
from toolkit.attention.torch_ref import TorchAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout


@dataclass
class PagedRunner:
    model: torch.nn.Module
    block_size: int = 4
    num_blocks: int = 256
    seed: int = 0
    backend: type = TorchAttention
    kv_cache: KVCache = field(init=False)
    attention: object = field(init=False)
    free: list[int] = field(init=False)

    def __post_init__(self) -> None:
        m, spec = self.model, self.model.spec
        self.kv_cache = KVCache(spec.num_layers, self.num_blocks, self.block_size, spec.num_kv_heads,
                                spec.head_dim, dtype=spec.dtype, device=m.device)
        for layer in self.kv_cache.layers:
            layer.fill_(float("nan"))   # a read of an unwritten slot poisons the result
        self.attention = build_attention(spec, partial(self.backend, self.kv_cache))
        self.free = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free)

    def new_table(self) -> list[int]:
        return []

    def step(self, tables: list[list[int]], tokens: list[list[int]], starts: list[int],
             last_only: bool = False) -> torch.Tensor:
        """Sequence b gets tokens[b] at positions starts[b]...; returns the logits of every new
        token [T, V], or with last_only of each sequence's last new token [B, V]."""
        bs = self.block_size
        for table, toks, start in zip(tables, tokens, starts):
            need = -(-(start + len(toks)) // bs)
            while len(table) < need:
                table.append(self.free.pop())
        kv_lens = [s + len(t) for s, t in zip(starts, tokens)]
        layout = PagedKVLayout.build(tables, kv_lens, [len(t) for t in tokens], bs, device=self.model.device)
        self.attention.plan(layout)
        ids = torch.tensor([t for toks in tokens for t in toks], dtype=torch.int64, device=self.model.device)
        pos = torch.tensor([p for s, toks in zip(starts, tokens) for p in range(s, s + len(toks))],
                           dtype=torch.int64, device=self.model.device)
        hidden = self.model.forward(ids, pos, self.attention)                     # [T, hidden]
        if last_only:
            hidden = hidden[torch.tensor([len(t) for t in tokens]).cumsum(0) - 1]   # [B, hidden]
        return self.model.compute_logits(hidden)


def greedy(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, block_size: int = 4,
           prefill_chunk: int | None = None) -> list[list[int]]:
    """Greedy decoding of a batch on the paged path: (chunked) prefill, then one token per step.

    Sequences run together; each stops at max_new_tokens (EOS is not special here, as
    HF generate is asked for a fixed length too).
    """
    runner = PagedRunner(model, block_size=block_size)
    tables = [runner.new_table() for _ in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    # prefill: in chunks, all sequences in one batch per chunk round
    chunk = prefill_chunk or max(len(p) for p in prompts)
    done = [0] * len(prompts)
    last_logits: list[torch.Tensor | None] = [None] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        idx = [b for b in range(len(prompts)) if done[b] < len(prompts[b])]
        toks = [prompts[b][done[b]:done[b] + chunk] for b in idx]
        logits = runner.step([tables[b] for b in idx], toks, [done[b] for b in idx], last_only=True)
        for j, b in enumerate(idx):
            done[b] += len(toks[j])
            last_logits[b] = logits[j]
    nxt = [int(lg.argmax()) for lg in last_logits]
    for _ in range(max_new_tokens):
        for b, t in enumerate(nxt):
            out[b].append(t)
        if len(out[0]) == max_new_tokens:
            break
        starts = [len(p) + len(o) - 1 for p, o in zip(prompts, out)]
        logits = runner.step(tables, [[t] for t in nxt], starts)
        nxt = logits.argmax(-1).tolist()
    return out


def run_schedule(runner: PagedRunner, schedule: dict[str, list[int]],
                 tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """The logits [S, V] of every token of every sequence, run step by step: step i gives
    sequence s its next schedule[s][i] tokens (0: it sits the step out; a 1 after its prompt
    is a decode), all of the step's sequences in one ragged batch."""
    tables = {s: runner.new_table() for s in schedule}
    done = {s: 0 for s in schedule}
    got: dict[str, list[torch.Tensor]] = {s: [] for s in schedule}
    vocab = runner.model.spec.vocab_size
    for step in range(max(len(c) for c in schedule.values())):
        seqs = [s for s, c in schedule.items() if step < len(c) and c[step] > 0]
        chunks = [tokens[s][done[s]:done[s] + schedule[s][step]] for s in seqs]
        logits = runner.step([tables[s] for s in seqs], chunks, [done[s] for s in seqs])   # [T, V]
        assert logits.dtype == torch.float32 and logits.shape == (sum(map(len, chunks)), vocab)
        for s, part in zip(seqs, logits.split([len(c) for c in chunks])):
            got[s].append(part)
            done[s] += schedule[s][step]
    return {s: torch.cat(v) for s, v in got.items()}
