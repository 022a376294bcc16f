"""Random walks through a grammar, checked against outlines-core at every step.

A walk picks random allowed tokens from the grammar's own bitmask row (the fast path) and
checks that row against outlines-core's Guide advanced over the same tokens (its
`write_mask_into` and, where cheap, `get_tokens`). After `budget` steps it heads for the
nearest final state through single-byte tokens (BFS), then samples EOS, so every walk ends.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import outlines_core
import torch

from toolkit.samplers.bitmask import pack_token_bitmask
from toolkit.samplers.grammar import CompiledGrammar, OutlinesGrammar


@dataclass
class Walk:
    token_ids: list[int]          # without the final EOS
    ended_with_eos: bool
    steps_checked: int


def allowed_ids(row: torch.Tensor, vocab_size: int) -> list[int]:
    """Token ids whose bit is set in one row int32 [W] (numpy: a fraction of torch's cost here)."""
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


def single_byte_tokens(compiled: CompiledGrammar) -> dict[int, int]:
    """token id -> its byte, for tokens that are one byte (one id per byte)."""
    out: dict[int, int] = {}
    seen: set[int] = set()
    for i, b in enumerate(compiled.vocab.token_bytes):
        if b is not None and len(b) == 1 and b[0] not in seen:
            out[i] = b[0]
            seen.add(b[0])
    return out


def path_to_final(compiled: CompiledGrammar, state: int, byte_tokens: list[int],
                  max_states: int = 20000) -> list[int]:
    """Shortest single-byte-token path from `state` to a final state (BFS)."""
    index = compiled.index
    prev: dict[int, tuple[int, int] | None] = {state: None}
    queue = deque([state])
    while queue and len(prev) < max_states:
        s = queue.popleft()
        if index.is_final_state(s):
            path = []
            while prev[s] is not None:
                s, t = prev[s]
                path.append(t)
            return path[::-1]
        for t in byte_tokens:
            n = index.get_next_state(s, t)
            if n is not None and n not in prev:
                prev[n] = (s, t)
                queue.append(n)
    raise AssertionError(f"no final state reachable from state {state} through single bytes")


def check_row(grammar: OutlinesGrammar, ref: outlines_core.Guide, row: torch.Tensor,
              with_get_tokens: bool) -> None:
    """The fast row equals outlines-core's own mask for the same state."""
    width = row.numel()
    want = torch.zeros(1, width, dtype=torch.int32)
    ref.write_mask_into(want.data_ptr(), width, 4)
    assert torch.equal(row, want[0]), f"bitmask differs from Guide.write_mask_into at state {grammar.state}"
    if with_get_tokens:
        from_tokens = pack_token_bitmask([ref.get_tokens()], width * 32)
        assert torch.equal(row, from_tokens[0]), "bitmask differs from Guide.get_tokens"


def random_walk(compiled: CompiledGrammar, rng: random.Random, budget: int = 40,
                p_eos: float = 0.3, get_tokens_every: int = 4) -> Walk:
    grammar = compiled.new_grammar()
    ref = outlines_core.Guide(compiled.index)
    vocab = compiled.vocab
    eos = vocab.eos_token_ids[0]
    row = torch.empty(1, vocab.bitmask_width, dtype=torch.int32)
    byte_tokens = sorted(single_byte_tokens(compiled))
    tokens: list[int] = []
    plan: list[int] | None = None
    step = 0
    while True:
        grammar.fill_bitmask(row, 0)
        check_row(grammar, ref, row[0], with_get_tokens=step % get_tokens_every == 0)
        assert grammar.can_continue(), f"dead end at state {grammar.state} after {tokens}"
        allowed = allowed_ids(row[0], vocab.vocab_size)
        assert allowed, "a live grammar allowed no token"
        assert plan != [] or eos in allowed, "the BFS path ended in a state without EOS"
        others = [t for t in allowed if t != eos]
        if eos in allowed and (not others or plan == [] or rng.random() < p_eos):
            assert grammar.accept([eos]) and grammar.is_terminated() and not grammar.can_continue()
            return Walk(tokens, True, step + 1)
        if step >= budget and plan is None:
            plan = path_to_final(compiled, grammar.state, byte_tokens)
        if plan:
            tok = plan.pop(0)
            assert tok in allowed, "the BFS path took a token the mask forbids"
        else:
            tok = rng.choice(others)
        assert grammar.accept([tok]), f"the grammar refused token {tok} its own mask allowed"
        ref.advance(tok, return_tokens=False)
        assert grammar.state == ref.get_state()
        tokens.append(tok)
        step += 1
        assert step < budget + 2000, "walk did not end"
