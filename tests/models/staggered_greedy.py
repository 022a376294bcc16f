"""Test-only: greedy decoding through the paged KV cache over ragged steps in which the
sequences are at different stages: sequence b joins at step b, its prompt goes in chunks,
then one token a step, so prompt chunks and decode tokens share batches. The model is
driven from its `spec` alone (paged.PagedRunner: one KVCache, the product's
build_attention routing alike layers to one backend, CPUAttention by default here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paged import PagedRunner

from toolkit.attention.cpu import CPUAttention


def cpu_runner(model: Any, block_size: int = 4, num_blocks: int = 64) -> PagedRunner:
    return PagedRunner(model, block_size=block_size, num_blocks=num_blocks, backend=CPUAttention)


def greedy_staggered(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     chunk: int = 6, block_size: int = 4) -> list[list[int]]:
    """Each sequence's max_new_tokens greedy tokens; a prompt of more than `chunk` tokens is
    split over steps."""
    runner = cpu_runner(model, block_size=block_size)
    tables: list[list[int]] = [runner.new_table() for _ in prompts]
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)                     # tokens already in the cache
    out: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(o) < max_new_tokens for o in out):
        live = [b for b in range(len(prompts)) if b <= step and len(out[b]) < max_new_tokens]
        chunks = [seqs[b][done[b]:done[b] + chunk] for b in live]
        logits = runner.step([tables[b] for b in live], chunks, [done[b] for b in live],
                             last_only=True)      # [B, V]
        for j, b in enumerate(live):
            done[b] += len(chunks[j])
            if done[b] == len(seqs[b]):           # the prompt (or last token) is in: sample
                tok = int(logits[j].argmax())
                out[b].append(tok)
                seqs[b].append(tok)
        step += 1
    return out
