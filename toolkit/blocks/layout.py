"""PagedKVLayout: the one page-table encoding of the toolkit (FlashInfer's CSR form).

For a batch of B sequences, sequence b has q_len[b] query tokens that are the last
q_len[b] of its kv_len[b] tokens; its KV lives in blocks
kv_indices[kv_indptr[b]:kv_indptr[b+1]], the last one holding kv_last_page_len[b].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain

import numpy as np
import torch


_INDEX_FIELDS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "slot_mapping")


@dataclass
class PagedKVLayout:
    qo_indptr: torch.Tensor         # int32 [B+1]: query tokens of sequence b are rows qo_indptr[b]:qo_indptr[b+1]
    kv_indptr: torch.Tensor         # int32 [B+1]: pages of sequence b are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_indices: torch.Tensor        # int32 [nnz]: physical block ids
    kv_last_page_len: torch.Tensor  # int32 [B]: tokens in the last page, in [1, block_size]
    slot_mapping: torch.Tensor      # int64 [T]: physical slot (block * block_size + offset) of each new token; -1 = skip
    block_size: int
    # host-side facts, so kernels need no device->host sync to size their grids
    max_q_len: int
    max_kv_len: int
    num_seqs: int
    num_tokens: int
    # the same index tensors on the CPU (build() keeps them), so plan() reads them without a
    # device->host sync; None = this layout is on the CPU already
    host_copy: "PagedKVLayout | None" = None

    @property
    def host(self) -> "PagedKVLayout":
        """This layout's tensors on the CPU (free when build() made it)."""
        if self.host_copy is not None:
            return self.host_copy
        if self.kv_indptr.device.type == "cpu":
            return self
        return self.to("cpu")

    @property
    def kv_lens(self) -> torch.Tensor:
        """int32 [B]: tokens of each sequence in the cache (after this step's writes)."""
        pages = self.kv_indptr[1:] - self.kv_indptr[:-1]
        return ((pages - 1) * self.block_size + self.kv_last_page_len).to(torch.int32)

    @property
    def q_lens(self) -> torch.Tensor:
        return (self.qo_indptr[1:] - self.qo_indptr[:-1]).to(torch.int32)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The index tensors by field name (to upload them together with a step's others)."""
        return {k: getattr(self, k) for k in _INDEX_FIELDS}

    def with_tensors(self, tensors: dict[str, torch.Tensor]) -> PagedKVLayout:
        """This host layout's facts over `tensors` (its index tensors, already on the
        device); this layout becomes the result's host_copy."""
        return replace(self, **{k: tensors[k] for k in _INDEX_FIELDS}, host_copy=self)

    def to(self, device: torch.device | str) -> PagedKVLayout:
        t = lambda x: x.to(device, non_blocking=True)
        on_cpu = torch.device(device).type == "cpu"
        return PagedKVLayout(t(self.qo_indptr), t(self.kv_indptr), t(self.kv_indices),
                             t(self.kv_last_page_len), t(self.slot_mapping), self.block_size,
                             self.max_q_len, self.max_kv_len, self.num_seqs, self.num_tokens,
                             None if on_cpu else self.host)

    @staticmethod
    def build(
        block_tables: Sequence[Sequence[int]],
        kv_lens: Sequence[int],
        q_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        num_pad_seqs: int = 0,
    ) -> PagedKVLayout:
        """Layout of a batch: sequence b holds kv_lens[b] tokens after this step, the last
        q_lens[b] of which are new (queries, and written to the cache this step).

        num_pad_seqs appends that many one-token sequences over block 0 whose slots are -1
        (never written): the padding of a CUDA-graph batch, whose outputs are discarded."""
        if not (len(block_tables) == len(kv_lens) == len(q_lens)):
            raise ValueError("block_tables, kv_lens and q_lens must have one entry per sequence, got "
                             f"{len(block_tables)}, {len(kv_lens)}, {len(q_lens)}")
        if num_pad_seqs:
            block_tables = list(block_tables) + [[0]] * num_pad_seqs
            kv_lens = list(kv_lens) + [1] * num_pad_seqs
            q_lens = list(q_lens) + [1] * num_pad_seqs
        kv = np.asarray(kv_lens, dtype=np.int64).reshape(-1)            # [B]
        q = np.asarray(q_lens, dtype=np.int64).reshape(-1)              # [B]
        bad = np.flatnonzero((q < 1) | (q > kv))
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"need 1 <= q_len <= kv_len, got q_len={int(q[b])}, kv_len={int(kv[b])}")
        n_pages = -(-kv // block_size)                                  # [B]
        pages = []                                                      # one loop over B, not T
        for table, n, kv_len in zip(block_tables, n_pages.tolist(), kv.tolist()):
            if len(table) < n:
                raise ValueError(f"a sequence of {kv_len} tokens needs {n} blocks of "
                                 f"{block_size}, its block table has {len(table)}")
            pages.append(table[:n])
        kv_indices = np.fromiter(chain.from_iterable(pages), dtype=np.int64,
                                 count=int(n_pages.sum()))              # [nnz]
        kv_indptr = np.concatenate([[0], np.cumsum(n_pages)])          # [B+1]
        qo_indptr = np.concatenate([[0], np.cumsum(q)])                 # [B+1]
        num_tokens = int(qo_indptr[-1])
        # slot of each new token t of sequence b at position p = kv_len - q_len + (t - qo_indptr[b])
        seq = np.repeat(np.arange(len(q)), q)                           # [T]
        pos = np.arange(num_tokens) - qo_indptr[seq] + (kv - q)[seq]    # [T]
        block = kv_indices[kv_indptr[seq] + pos // block_size]          # [T]
        slots = block * block_size + pos % block_size                   # [T]
        if num_pad_seqs:
            slots[num_tokens - num_pad_seqs:] = -1
        last = kv - (n_pages - 1) * block_size                          # [B]
        pin = torch.device(device).type == "cuda"
        host = PagedKVLayout(
            *(torch.from_numpy(x.astype(np.int32)) for x in (qo_indptr, kv_indptr, kv_indices, last)),
            torch.from_numpy(slots.astype(np.int64)), block_size,
            int(q.max(initial=0)), int(kv.max(initial=0)), len(q), num_tokens,
        )
        if torch.device(device).type == "cpu":
            return host
        if pin:
            host = PagedKVLayout(*(x.pin_memory() if isinstance(x, torch.Tensor) else x
                                   for x in host.__dict__.values()))
        return host.to(device)       # keeps `host` as host_copy


def slot_mapping(block_table: Sequence[int], start: int, stop: int, block_size: int) -> list[int]:
    """Physical slots of token positions [start, stop) of one sequence."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, stop)]
