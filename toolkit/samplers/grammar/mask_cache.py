"""`MaskTable`: grammar mask rows kept on the device, one slot per distinct grammar state.

A step of 64 constrained rows would otherwise copy 64 mask rows of ceil(V/32) words on the
host (19 KB each at V = 152k) and upload them (1.2 MB). Rows in the same grammar state share
one mask, and a request revisits few states, so the table keeps each state's row on the
device: the host sends one int32 slot per logits row, and the bitmask kernel reads
table[slot]. Only a state seen for the first time is filled on the host and uploaded.

    table = MaskTable(vocab_size, device)
    slots = table.rows(grammars, drafts)       # list[int], one per logits row; uploads new rows
    apply_token_bitmask(logits, table.table, rows=slots_on_device)

Keys: `grammar.mask_key()` (optional in the `Grammar` contract) names the row a grammar would
write now; equal keys promise equal rows. A grammar without it gets a fresh slot every step.
Slot 0 is all ones (unconstrained rows, rows after a rejected draft). When a step's new rows
do not fit, the table forgets every key and starts again (the rows it holds are overwritten
in stream order, after the kernels that read them).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from toolkit.samplers.grammar.base import Grammar
from toolkit.samplers.grammar.batch import walk_drafts

ALL_ONES = 0          # the slot every unconstrained row uses


class MaskTable:
    def __init__(self, vocab_size: int, device: torch.device | str, *,
                 max_bytes: int = 64 << 20, max_slots: int = 8192) -> None:
        """vocab_size: V (rows have ceil(V/32) int32 words); the table holds up to max_slots
        rows and max_bytes (it grows past them only when one step needs more rows)."""
        if not (isinstance(vocab_size, int) and vocab_size >= 1):
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.device = torch.device(device)
        self.width = (vocab_size + 31) // 32
        self.capacity = max(min(max_bytes // (4 * self.width), max_slots), 2)
        self.table = self._new_table(self.capacity)          # int32 [capacity, W] on the device
        self._pinned = self.device.type == "cuda"
        self._staging = torch.empty(0, self.width, dtype=torch.int32)   # host rows of one step
        self._uploaded: torch.cuda.Event | None = None       # the last upload from _staging
        self._slots: dict[Hashable, int] = {}                # mask key -> slot
        self._next = 1                                        # the first unused slot
        self._first_new = 1                                   # this step's first new slot
        self.uploads = 0                                      # rows uploaded so far (a metric)
        self.resets = 0

    def _new_table(self, rows: int) -> Tensor:
        table = torch.empty(rows, self.width, dtype=torch.int32, device=self.device)
        table[ALL_ONES] = -1
        return table

    def rows(self, grammars: Sequence[Grammar | None],
             drafts: Sequence[Sequence[int]] | None = None) -> list[int]:
        """The slot of every logits row of a step, in the layout of `fill_batch_bitmask`:
        request i owns 1 + len(drafts[i]) rows (its draft positions, then the bonus one); a
        row after a draft the grammar rejects is all ones. New rows are uploaded before this
        returns (queued on the current stream, no host wait)."""
        drafts = drafts if drafts is not None else [()] * len(grammars)
        if len(drafts) != len(grammars):
            raise ValueError(f"one draft list per grammar: {len(grammars)} grammars, "
                             f"{len(drafts)} draft lists")
        self._begin(sum(1 + len(d) for d in drafts))
        out: list[int] = []
        for g, d in zip(grammars, drafts):
            if g is None:
                out.extend([ALL_ONES] * (1 + len(d)))
            elif not d:
                out.append(self._slot(g))                     # the common row
            else:
                start = len(out)
                walk_drafts(g, d, lambda i, g=g: out.append(self._slot(g)))
                out.extend([ALL_ONES] * (start + 1 + len(d) - len(out)))
        self._upload()
        return out

    # ---- one step ----------------------------------------------------------------------
    def _begin(self, need: int) -> None:
        """Make room for `need` new rows and a staging buffer that holds them."""
        if need + 1 > self.capacity:                 # one step needs more than the table
            self.capacity = 2 * need + 1
            self.table = self._new_table(self.capacity)
            self._forget()
        elif self._next + need > self.capacity:
            self._forget()
        if self._staging.shape[0] < need:
            self._staging = torch.empty(max(need, 64), self.width, dtype=torch.int32,
                                        pin_memory=self._pinned)
        elif self._uploaded is not None:
            self._uploaded.synchronize()             # the last copy from _staging has run
        self._first_new = self._next

    def _forget(self) -> None:
        self._slots.clear()
        self._next = 1
        self.resets += 1

    def _slot(self, grammar: Grammar) -> int:
        key_of = getattr(grammar, "mask_key", None)
        key = key_of() if key_of is not None else None
        if key is not None:
            slot = self._slots.get(key)
            if slot is not None:
                return slot
        slot, self._next = self._next, self._next + 1
        grammar.fill_bitmask(self._staging, slot - self._first_new)
        if key is not None:
            self._slots[key] = slot
        return slot

    def _upload(self) -> None:
        m = self._next - self._first_new
        if not m:
            return
        self.table[self._first_new:self._next].copy_(self._staging[:m], non_blocking=self._pinned)
        self.uploads += m
        if self._pinned:
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()

    def __repr__(self) -> str:
        return (f"MaskTable({self._next - 1} of {self.capacity - 1} slots used, W={self.width}, "
                f"{self.uploads} rows uploaded, {self.resets} resets)")
