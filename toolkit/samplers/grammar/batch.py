"""Filling a step's bitmask for a batch of grammars (the engine's per-step call).

Row layout = the logits rows: request i owns 1 + len(drafts[i]) consecutive rows (its
draft positions, then the bonus position), in batch order. Unconstrained requests get
all-ones rows, so constrained and free requests share one bitmask and one kernel launch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from toolkit.samplers.grammar.base import Grammar


def allocate_token_bitmask(num_rows: int, vocab_size: int, *, pin_memory: bool = False) -> Tensor:
    """int32 [num_rows, ceil(V/32)] on the CPU, every token allowed (-1 = all 32 bits set).
    pin_memory=True lets the engine copy it to the GPU without a sync."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32,
                      pin_memory=pin_memory)


def walk_drafts(grammar: Grammar, draft_tokens: Sequence[int],
                emit: Callable[[int], None]) -> int:
    """Visit the states a step's rows need: emit(i) while the grammar stands where row i's mask
    comes from (i = 0: now; i > 0: after draft_tokens[:i]), in order of i.

    Returns how many leading drafts the grammar accepts (rows past that many + 1, or past an
    accepted EOS, are not emitted: the caller makes them all ones). The grammar ends where
    it began.
    """
    emit(0)
    if not draft_tokens:
        return 0                                  # the common row: nothing to try or undo
    n = 0
    for t in draft_tokens:
        if grammar.is_terminated() or not grammar.accept([t]):
            break
        n += 1
        if grammar.is_terminated():
            break
        emit(n)
    grammar.rollback(n)
    return n


def fill_grammar_rows(bitmask: Tensor, row: int, grammar: Grammar | None,
                      draft_tokens: Sequence[int] = ()) -> int:
    """Fill rows [row, row + len(draft_tokens) + 1): row + i = the mask after draft_tokens[:i].

    Returns how many leading drafts the grammar accepts. Rows past the first invalid draft
    (or past an accepted EOS) are all ones: verification rejects at the invalid draft, whose
    row forbids it, so those rows are never sampled from. The grammar ends where it began.
    """
    k = len(draft_tokens)
    if grammar is None:
        bitmask[row:row + k + 1] = -1
        return k
    filled = [0]                                  # rows written so far

    def fill(i: int) -> None:
        grammar.fill_bitmask(bitmask, row + i)
        filled[0] = i + 1

    n = walk_drafts(grammar, draft_tokens, fill)
    bitmask[row + filled[0]:row + k + 1] = -1
    return n


def fill_batch_bitmask(bitmask: Tensor, grammars: Sequence[Grammar | None],
                       drafts: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Fill every row of a step. bitmask: int32 [sum(1 + len(d)), W] on the CPU.

    grammars[i] is request i's grammar or None (unconstrained); drafts[i] its speculative
    tokens (default none). Returns per request the number of drafts its grammar accepts.
    """
    drafts = drafts if drafts is not None else [()] * len(grammars)
    if len(drafts) != len(grammars):
        raise ValueError(f"one draft list per grammar: {len(grammars)} grammars, {len(drafts)} draft lists")
    rows = sum(1 + len(d) for d in drafts)
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32 or bitmask.shape[0] != rows:
        raise ValueError(f"bitmask must be int32 [{rows}, W] (one row per logits row), "
                         f"got {bitmask.dtype} {tuple(bitmask.shape)}")
    if bitmask.device.type != "cpu":
        raise ValueError("fill the bitmask on the CPU (pinned), then copy it to the device")
    out, row = [], 0
    for g, d in zip(grammars, drafts):
        out.append(fill_grammar_rows(bitmask, row, g, d))
        row += 1 + len(d)
    return out
