"""OutlinesGrammar semantics on a small hand-made vocabulary: accept / validate / rollback,
EOS only in final states, dead ends, draft rows for speculative decoding, the compiler."""

from __future__ import annotations

import string
from concurrent.futures import Future

import numpy as np
import outlines_core
import pytest
import torch
from walk import allowed_ids

from toolkit.samplers.bitmask import unpack_token_bitmask
from toolkit.samplers.grammar import (
    Grammar,
    GrammarCache,
    GrammarCompiler,
    Structured,
    allocate_token_bitmask,
    build_vocabulary,
    fill_batch_bitmask,
    fill_grammar_rows,
)

# multi-character tokens first (their ids are what the assertions read), then every printable char
TOKENS = ["a", "b", "c", "ab", "bc", "yes", "no", *[c for c in string.printable[:95] if c not in "abc"]]
EOS, EOS2 = 200, 201                     # two ids the model stops on
V = 230                                  # logits width > vocabulary (padded embedding)


class TinyTokenizer:
    """The few attributes build_vocabulary reads from a tokenizer; plain (UTF-8) tokens."""

    eos_token_id = EOS
    all_special_ids = [EOS, EOS2]
    added_tokens_decoder: dict = {}

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(TOKENS)} | {"</s>": EOS, "<|end|>": EOS2}

    def __len__(self) -> int:
        return 202


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    vocab = build_vocabulary(TinyTokenizer(), vocab_size=V, eos_token_ids=[EOS, EOS2])
    with GrammarCompiler(vocabulary=vocab) as c:
        yield c


def ids(*tokens: str) -> list[int]:
    return [TOKENS.index(t) for t in tokens]


def row_ids(g, v: int = V) -> list[int]:
    m = allocate_token_bitmask(1, v)
    g.fill_bitmask(m, 0)
    return allowed_ids(m[0], v)


def test_protocol_and_numpy_unpack_agree(compiler) -> None:
    g = compiler.new_grammar(Structured.regex("(ab|a)c+"))
    assert isinstance(g, Grammar)
    m = allocate_token_bitmask(1, V)
    g.fill_bitmask(m, 0)
    assert allowed_ids(m[0], V) == unpack_token_bitmask(m, V)[0].nonzero().flatten().tolist()


def test_accept_is_atomic_and_validate_counts(compiler) -> None:
    g = compiler.new_grammar(Structured.regex("(ab|a)c+"))
    assert row_ids(g) == ids("a", "ab")
    assert g.validate(ids("a", "c", "b")) == 2
    s0 = g.state
    assert not g.accept(ids("a", "c", "b")) and g.state == s0      # nothing advanced
    assert not g.accept(ids("c")) and g.state == s0                # one token: the same
    assert not g.accept([EOS]) and g.state == s0 and not g.is_terminated()
    assert g.accept(ids("a")) and g.accept(ids("c"))
    g.rollback(2)
    assert g.state == s0
    assert g.accept(ids("ab", "c"))
    assert set(row_ids(g)) == {TOKENS.index("c"), EOS, EOS2}     # final: every EOS id allowed
    assert g.validate([EOS, TOKENS.index("c")]) == 1             # nothing after EOS


def test_eos_only_in_final_states_and_rollback_undoes_it(compiler) -> None:
    g = compiler.new_grammar(Structured.regex("ab?c"))
    assert not g.accept([EOS]) and not g.is_terminated()
    assert g.accept(ids("a", "bc"))
    assert g.accept([EOS2]) and g.is_terminated() and not g.can_continue()
    m = allocate_token_bitmask(1, V)
    g.fill_bitmask(m, 0)
    assert not m.any()                                           # terminated: nothing allowed
    g.rollback(1)
    assert not g.is_terminated() and g.can_continue() and set(row_ids(g)) == {EOS, EOS2}
    g.rollback(2)
    assert row_ids(g) == ids("a", "ab")
    with pytest.raises(ValueError, match="can roll back 0..0"):
        g.rollback(1)


def test_rollback_window(compiler) -> None:
    g = compiler.compile(Structured.regex("a*")).new_grammar(max_rollback=3)
    assert g.accept(ids("a") * 5)
    g.rollback(3)
    with pytest.raises(ValueError, match="max_rollback=3"):
        g.rollback(1)
    assert g.accept(ids("a"))


def test_dead_end_when_eos_is_not_allowed(compiler) -> None:
    """choice 'yes' completed: only EOS remains, so a request that may not stop is stuck."""
    g = compiler.new_grammar(Structured.choice(["yes", "no"]))
    assert g.can_continue(allow_eos=False)
    assert g.accept(ids("yes"))
    assert g.can_continue() and not g.can_continue(allow_eos=False)


def test_fast_mask_equals_outlines_guide(compiler) -> None:
    compiled = compiler.compile(Structured.json({"type": "object", "properties": {"a": {"type": "integer"}}}))
    g, ref = compiled.new_grammar(), outlines_core.Guide(compiled.index)
    for tok in ids(*'{ "a":12}'):
        m = allocate_token_bitmask(1, V)
        g.fill_bitmask(m, 0)
        want = torch.zeros_like(m)
        ref.write_mask_into(want.data_ptr(), want.numel(), 4)
        assert torch.equal(m, want)
        assert allowed_ids(m[0], V) == sorted(ref.get_tokens())
        assert g.accept([tok])
        ref.advance(tok, return_tokens=False)
    assert compiled.num_cached_states > 0


def test_draft_rows_mask_every_position_and_keep_the_state(compiler) -> None:
    # (outlines-core 0.2.14 drops edges out of a final state that a loop re-enters, e.g.
    # "c(ab)*" allows "ab" but not "a" after "c"; these patterns avoid that)
    g = compiler.new_grammar(Structured.regex("ab(c|ab)c"))
    m = allocate_token_bitmask(5, V)
    drafts = ids("a", "b", "a", "b")
    n = fill_grammar_rows(m, 0, g, drafts)
    assert n == 4 and g.state == compiler.new_grammar(Structured.regex("ab(c|ab)c")).state
    step = compiler.new_grammar(Structured.regex("ab(c|ab)c"))
    for i in range(5):                                   # row i = mask after drafts[:i]
        assert allowed_ids(m[i], V) == row_ids(step), i
        if i < 4:
            step.accept([drafts[i]])
    m2 = allocate_token_bitmask(4, V)
    assert fill_grammar_rows(m2, 0, g, ids("a", "c", "b")) == 1   # "c" is invalid after "a"
    assert allowed_ids(m2[1], V) == ids("b", "bc") and (m2[2:] == -1).all()


def test_draft_rows_after_eos_are_free(compiler) -> None:
    g = compiler.new_grammar(Structured.regex("ab"))
    m = allocate_token_bitmask(4, V)
    assert fill_grammar_rows(m, 0, g, [*ids("ab"), EOS, TOKENS.index("a")]) == 2
    assert (m[2:] == -1).all() and not g.is_terminated()


def test_batch_rows_mix_free_and_constrained(compiler) -> None:
    a = compiler.new_grammar(Structured.regex("a+"))
    b = compiler.new_grammar(Structured.choice(["no"]))
    m = allocate_token_bitmask(1 + 3 + 1, V)
    counts = fill_batch_bitmask(m, [a, None, b], [(), [1, 2], ()])
    assert counts == [0, 2, 0]
    assert allowed_ids(m[0], V) == ids("a") and (m[1:4] == -1).all()
    assert allowed_ids(m[4], V) == ids("no", "n")
    with pytest.raises(ValueError, match="one row per logits row"):
        fill_batch_bitmask(allocate_token_bitmask(2, V), [a])
    with pytest.raises(ValueError, match="one draft list per grammar"):
        fill_batch_bitmask(m, [a], [(), ()])


def test_compile_async_dedups_caches_and_reports_errors(compiler) -> None:
    spec = Structured.json_object(depth=1)
    fut = compiler.compile_async(spec)
    assert isinstance(fut, Future) and not fut.done()          # compiling off the caller's thread
    assert compiler.compile_async(Structured.json_object(depth=1)) is fut
    assert fut.result(timeout=120).spec == spec
    bad = compiler.compile_async(Structured.regex("xé"))       # no token spells "é"
    with pytest.raises(ValueError, match="cannot be compiled for this tokenizer"):
        bad.result(timeout=60)
    with pytest.raises(ValueError, match="lookaround"):        # cheap check: raises at once
        compiler.compile_async({"regex": "a(?=b)"})


def test_cache_is_lru_bounded() -> None:
    cache = GrammarCache(max_entries=2)
    made = []

    def submit(i: int):
        def f() -> Future:
            fut: Future = Future()
            fut.set_result(i)
            made.append(i)
            return fut
        return f

    for i in [1, 2, 1, 3, 2]:
        cache.get_or_submit(("v", i), submit(i))
    assert made == [1, 2, 3, 2] and len(cache) == 2 and ("v", 1) not in cache


def test_bitmask_layout_matches_the_sampler_kernel_twin(compiler) -> None:
    from toolkit.kernels.reference_sampling import apply_token_bitmask

    g = compiler.new_grammar(Structured.choice(["ab", "bc"]))
    m = allocate_token_bitmask(1, V)
    g.fill_bitmask(m, 0)
    logits = torch.zeros(1, V)
    apply_token_bitmask(logits, m)
    assert np.flatnonzero(torch.isfinite(logits[0]).numpy()).tolist() == ids("a", "b", "ab", "bc")
