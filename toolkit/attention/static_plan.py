"""Fixed-capacity attention tables, so that a decode step's attention can live inside one
CUDA graph with the rest of the forward.

The piecewise graphs (worker/cuda_graphs.py) run attention eagerly between L + 1 graph
pieces, because a step's tile schedule (how many work items, how many KV splits, where each
sequence's page list starts) changes from step to step; from Python that is a few launches
per layer, milliseconds per step at batch 256. For a step whose every sequence is in the
decode class (q_len <= the decode tile's block_q: decodes, draft verification, short
chunks) the launches can be fixed instead:

- two launch shapes per bucket, each with a fixed grid: "direct" (no sequence split: the
  decode kernel over `tokens` work rows writes the output itself) and "split" (the decode
  kernel in split mode over `work_cap` rows, then the merge over `tokens` rows); a step
  takes the first that holds its schedule (the engine captures a graph of each);
- the step's schedule is copied into those tables (one host -> device copy) and the page
  list into a fixed buffer (one device copy); rows past the step's are zero, which the kernels
  skip (a work item with no query row and no key; a merge row with zero splits);
- a step whose schedule does not fit (a prefill tile, more splits or pages than the bucket
  holds) says so, and takes the piecewise path.

Splitting is bounded for a bucket of T tokens: the schedule splits a sequence into at most
ceil(target_programs / (n * H_kv)) parts (+1 where a window misaligns them) for n decode
sequences, and a step that lands in this bucket has more tokens than the bucket before it,
so at least ceil((T_prev + 1) / block_q) sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from toolkit.attention.schedule import Schedule, max_decode_splits
from toolkit.kernels.reference_attention import WORK_COLS


@dataclass
class BucketTables:
    """One bucket's views of the shared buffers."""

    tokens: int                 # T: query rows of the bucket (merge rows, one per token)
    max_splits: int             # S: splits a sequence may have in this bucket
    table: torch.Tensor         # int32 [work_cap * WORK_COLS + tokens * 2] (work | merge)
    work: torch.Tensor          # int32 [work_cap, WORK_COLS]
    merge: torch.Tensor         # int32 [tokens, 2]
    part_out: torch.Tensor      # float32 [tokens, H, S, D]
    part_lse: torch.Tensor      # float32 [tokens, H, S]

    @property
    def work_cap(self) -> int:
        return self.work.shape[0]


class StaticDecodePlans:
    """Tables for every CUDA-graph bucket of one attention backend, allocated once (a graph
    bakes in their addresses). Buckets replay one at a time on one stream, so they share
    one partials buffer and one page-list buffer."""

    def __init__(self, sizes: list[int], *, num_heads: int, num_kv_heads: int, head_dim: int,
                 decode_block_q: int, target_programs: int, min_split_tokens: int,
                 max_pages: int, max_tokens_per_seq: int, windowed: bool,
                 device: torch.device, max_splits: int = 0) -> None:
        self.device = device
        caps, prev = {}, 0
        for t in sorted(sizes):
            min_seqs = max(1, -(-(prev + 1) // decode_block_q))
            caps[t] = max_decode_splits(target_programs=target_programs, num_kv_heads=num_kv_heads,
                                        min_split_tokens=min_split_tokens, max_splits=max_splits,
                                        max_tokens_per_seq=max_tokens_per_seq, num_seqs=min_seqs)
            prev = t
        part = max(t * s for t, s in caps.items())
        self._part_out = torch.empty(part * num_heads * head_dim, dtype=torch.float32, device=device)
        self._part_lse = torch.empty(part * num_heads, dtype=torch.float32, device=device)
        # the fused merge's done-counters, a slot per (merge row, KV head); kept zero by it
        self.counters = torch.zeros(max(sizes) * num_kv_heads, dtype=torch.int32, device=device)
        # the page lists of a step: every block of the cache (sequences may share some), plus
        # one page per padding row of the largest bucket
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.buckets: dict[int, BucketTables] = {}
        for t, s in caps.items():
            # n sequences split into at most ceil(target / (n * H_kv)) parts each (+1 with a
            # window): at most target / H_kv + n items (+ n). A tight cap matters: every row
            # is a program, and an empty one still takes an SM slot (decode tiles hold one
            # program per SM at head_dim 128)
            extra = -(-target_programs // num_kv_heads) if target_programs > 0 else 0
            work_cap = min(t * s, extra + t * (2 if windowed else 1))
            table = torch.zeros(work_cap * WORK_COLS + t * 2, dtype=torch.int32, device=device)
            self.buckets[t] = BucketTables(
                t, s, table, table[:work_cap * WORK_COLS].view(work_cap, WORK_COLS),
                table[work_cap * WORK_COLS:].view(t, 2),
                self._part_out[: t * num_heads * s * head_dim].view(t, num_heads, s, head_dim),
                self._part_lse[: t * num_heads * s].view(t, num_heads, s))

    def fill(self, bucket: int, sched: Schedule, kv_indices: torch.Tensor) -> str | None:
        """Copy a step's schedule and page list into bucket `bucket`'s tables. Returns the
        launch shape that holds it, "direct" (nothing split) or "split", or None (and nothing
        copied) when the step does not fit."""
        b = self.buckets.get(bucket)
        if (b is None or len(sched.prefill) or len(sched.decode) > b.work_cap
                or sched.num_splits > b.max_splits or len(sched.merge_rows) > b.tokens
                or kv_indices.numel() > self.kv_indices.numel()):
            return None
        mode = "split" if sched.split else "direct"      # direct: one row per sequence <= tokens
        host = np.zeros(b.table.numel(), dtype=np.int32)          # zero rows: skipped
        if len(sched.decode):
            host[: len(sched.decode) * WORK_COLS] = np.asarray(sched.decode, dtype=np.int32).ravel()
        if len(sched.merge_rows):
            start = b.work_cap * WORK_COLS
            host[start: start + 2 * len(sched.merge_rows)] = np.asarray(sched.merge_rows, dtype=np.int32).ravel()
        host_t = torch.from_numpy(host)
        if self.device.type == "cuda":        # pinned: the copy does not wait for the GPU queue
            host_t = host_t.pin_memory()
        b.table.copy_(host_t, non_blocking=True)
        self.kv_indices[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)
        return mode
