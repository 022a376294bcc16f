"""MaskTable (grammar mask rows on the device, one slot per state) against its twin, the
bitmask filled row by row (fill_batch_bitmask): over random batches of grammars, drafts,
terminated and free rows, steps after steps, with a table small enough to be reset."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grammar import EOS, TOKENS, V, TinyTokenizer
from walk import allowed_ids

from toolkit.samplers.grammar import (
    GrammarCompiler,
    Structured,
    allocate_token_bitmask,
    build_vocabulary,
    fill_batch_bitmask,
)
from toolkit.samplers.grammar.mask_cache import ALL_ONES, MaskTable

SPECS = [Structured.regex("(ab|a)c+"), Structured.regex("(yes|no)( [a-c]{1,3}){0,3}"),
         Structured.json({"type": "object", "properties": {"a": {"type": "integer"}},
                          "required": ["a"]})]


@pytest.fixture(scope="module")
def compiled() -> list:
    vocab = build_vocabulary(TinyTokenizer(), vocab_size=V)
    with GrammarCompiler(vocabulary=vocab) as c:
        yield [c.compile(s) for s in SPECS]


class Keyless:
    """A Grammar without mask_key: the table must give it a fresh row every step."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        if name == "mask_key":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _step(rng: random.Random, grammars: list, max_drafts: int) -> list[list[int]]:
    drafts = []
    for g in grammars:
        d: list[int] = []
        if g is not None and max_drafts:
            for _ in range(rng.randint(0, max_drafts)):   # mostly valid drafts, some random
                row = allocate_token_bitmask(1, V)
                g.fill_bitmask(row, 0)
                ok = allowed_ids(row[0], V)
                if not ok or not g.accept([t := rng.choice(ok) if rng.random() < 0.8
                                           else rng.randrange(V)]):
                    break
                d.append(t)
            g.rollback(len(d))
            if d and rng.random() < 0.3:
                d.append(rng.randrange(V))                  # a draft the grammar may reject
        drafts.append(d if g is not None else [0] * rng.randint(0, max_drafts))
    return drafts


@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), max_drafts=st.integers(0, 3),
       max_rows=st.integers(2, 12))
@settings(max_examples=25, deadline=None)
def test_table_rows_equal_filled_bitmask(compiled, seed: int, n: int, max_drafts: int,
                                         max_rows: int) -> None:
    rng = random.Random(seed)
    table = MaskTable(V, "cpu", max_bytes=max_rows * 4 * ((V + 31) // 32))
    grammars = []
    for _ in range(n):
        kind = rng.random()
        g = None if kind < 0.2 else compiled[rng.randrange(len(compiled))].new_grammar(max_rollback=8)
        grammars.append(Keyless(g) if g is not None and kind > 0.85 else g)
    for _ in range(6):
        drafts = _step(rng, grammars, max_drafts)
        states = [None if g is None else (g.state, g.is_terminated()) for g in grammars]
        slots = table.rows(grammars, drafts)
        assert [None if g is None else (g.state, g.is_terminated()) for g in grammars] == states
        want = allocate_token_bitmask(sum(1 + len(d) for d in drafts), V)
        fill_batch_bitmask(want, grammars, drafts)
        assert torch.equal(table.table[torch.tensor(slots)], want), (slots, drafts)
        row = 0
        for g, d in zip(grammars, drafts):
            if g is None:
                assert slots[row:row + 1 + len(d)] == [ALL_ONES] * (1 + len(d))
            row += 1 + len(d)
        for g in grammars:                         # advance each grammar by one allowed token
            if g is None or g.is_terminated():
                continue
            m = allocate_token_bitmask(1, V)
            g.fill_bitmask(m, 0)
            ok = allowed_ids(m[0], V)
            if ok:
                assert g.accept([rng.choice(ok)])


def test_rows_in_one_state_share_a_slot_and_are_uploaded_once(compiled) -> None:
    table = MaskTable(V, "cpu")
    grammars = [compiled[0].new_grammar() for _ in range(5)] + [None]
    first = table.rows(grammars)
    assert len(set(first[:5])) == 1 and first[5] == ALL_ONES and table.uploads == 1
    assert table.rows(grammars) == first and table.uploads == 1    # nothing new: no upload
    for g in grammars[:2]:
        assert g.accept([TOKENS.index("ab")])
    second = table.rows(grammars)
    assert second[0] == second[1] != second[2] == first[2] and table.uploads == 2
    grammars[0].accept([TOKENS.index("c")])
    grammars[0].accept([EOS])                                      # terminated: all zeros
    third = table.rows(grammars)
    assert not table.table[third[0]].any() and table.uploads == 3


def test_a_step_larger_than_the_table_grows_it(compiled) -> None:
    table = MaskTable(V, "cpu", max_bytes=1)                       # room for one slot
    grammars = [Keyless(compiled[1].new_grammar()) for _ in range(4)]
    slots = table.rows(grammars)
    assert len(set(slots)) == 4 and table.capacity > 4
    want = allocate_token_bitmask(4, V)
    fill_batch_bitmask(want, grammars)
    assert torch.equal(table.table[torch.tensor(slots)], want)
    with pytest.raises(ValueError, match="one draft list per grammar"):
        table.rows(grammars, [[]])
