"""Greedy constrained decoding with speculation equals it without: drafts are masked per
position (fill_grammar_rows), verified greedily, rejected ones rolled back."""

from __future__ import annotations

import hashlib

import pytest
import torch
from test_grammar import EOS, TinyTokenizer, V

from toolkit.kernels.reference_sampling import apply_token_bitmask
from toolkit.samplers.grammar import (
    GrammarCompiler,
    Structured,
    allocate_token_bitmask,
    build_vocabulary,
    fill_grammar_rows,
)


def fake_logits(prefix: list[int], salt: str) -> torch.Tensor:
    """A deterministic 'model': logits [V] from a hash of the prefix (EOS made likely)."""
    seed = int.from_bytes(hashlib.sha1(f"{salt}{prefix}".encode()).digest()[:8], "little")
    logits = torch.randn(V, generator=torch.Generator().manual_seed(seed))
    logits[EOS] += 1.5
    return logits


def greedy(grammar, rows: torch.Tensor, prefixes: list[list[int]], salt: str) -> list[int]:
    logits = torch.stack([fake_logits(p, salt) for p in prefixes])       # [R, V]
    apply_token_bitmask(logits, rows)
    return logits.argmax(-1).tolist()


def decode_plain(grammar, max_tokens: int) -> list[int]:
    out: list[int] = []
    m = allocate_token_bitmask(1, V)
    while len(out) < max_tokens and not grammar.is_terminated():
        grammar.fill_bitmask(m, 0)
        (tok,) = greedy(grammar, m, [out], "target")
        assert grammar.accept([tok])
        out.append(tok)
    return out


def decode_speculative(grammar, max_tokens: int, k: int) -> tuple[list[int], int]:
    out: list[int] = []
    accepted_drafts = 0
    while len(out) < max_tokens and not grammar.is_terminated():
        # drafter: alternately a grammar-aware copy of the target (accepted) and an
        # unconstrained other model (often breaks the grammar); it walks the grammar and rolls back
        drafts: list[int] = []
        row = allocate_token_bitmask(1, V)
        walked = 0
        for i in range(k):
            if i % 2 == 0 and not grammar.is_terminated():
                grammar.fill_bitmask(row, 0)
                (tok,) = greedy(grammar, row, [out + drafts], "target")
            else:
                tok = int(fake_logits(out + drafts, "draft").argmax())
            drafts.append(tok)
            if walked == i and grammar.accept([tok]):
                walked += 1
        grammar.rollback(walked)
        m = allocate_token_bitmask(k + 1, V)
        fill_grammar_rows(m, 0, grammar, drafts)
        targets = greedy(grammar, m, [out + drafts[:i] for i in range(k + 1)], "target")
        new: list[int] = []
        for i in range(k + 1):                  # greedy verification: keep drafts equal to the target
            new.append(targets[i])
            if i == k or drafts[i] != targets[i] or targets[i] == EOS:
                break
        accepted_drafts += len(new) - 1
        new = new[:max_tokens - len(out)]
        assert grammar.accept(new), (out, new)
        out += new
    return out, accepted_drafts


@pytest.mark.parametrize("spec", [
    Structured.json({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4}},
                     "required": ["a", "b"]}),
    Structured.regex("(yes|no)( [a-c]{1,3}){0,3}"),
    Structured.json_object(depth=0),
])
@pytest.mark.parametrize("k", [1, 3])
def test_speculation_does_not_change_greedy_output(spec: Structured, k: int) -> None:
    vocab = build_vocabulary(TinyTokenizer(), vocab_size=V)
    with GrammarCompiler(vocabulary=vocab) as compiler:
        compiled = compiler.compile(spec)
        plain = decode_plain(compiled.new_grammar(), 40)
        spec_out, accepted = decode_speculative(compiled.new_grammar(max_rollback=k + 1), 40, k)
    assert spec_out == plain
    assert accepted > 0, "the drafter should get some drafts accepted"
