"""Prompt-lookup proposer: unit cases and a brute-force oracle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.samplers.speculative.ngram import NgramProposer
from toolkit.types import Request, SamplingParams


def brute(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    L = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= L:
            continue
        for i in range(L - n - 1, -1, -1):                  # most recent first, not the suffix
            if tokens[i:i + n] == tokens[L - n:]:
                ext = list(tokens)
                for m in range(k):
                    ext.append(ext[i + n + m])              # "what followed", past the end too
                return ext[L:]
    return []


@pytest.mark.parametrize("tokens,k,want", [
    ([1, 2, 3, 4, 1, 2], 2, [3, 4]),                         # plain copy
    ([1, 2, 3, 4, 1, 2], 5, [3, 4, 1, 2, 3]),                # continues through the sequence
    ([5, 1, 2, 9, 1, 2, 7, 1, 2], 1, [7]),                   # most recent occurrence wins
    ([1, 2, 8, 3, 2, 9, 1, 2], 2, [8, 3]),                   # longest n first: "1 2" beats "2"
    ([7, 7], 3, [7, 7, 7]),                                  # a match right at the end: periodic
    ([1, 2, 1, 2], 4, [1, 2, 1, 2]),                         # period 2
    ([4], 3, []),                                            # too short to match
    ([1, 2, 3], 3, []),                                      # no repeat
    ([1, 2, 1, 2], 0, []),                                   # k = 0
])
def test_lookup_cases(tokens, k, want):
    assert NgramProposer(1, 3).lookup(tokens, k) == want


@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), k=st.integers(0, 6),
       min_n=st.integers(1, 3), extra=st.integers(0, 3))
def test_lookup_equals_brute_force(tokens, k, min_n, extra):
    assert NgramProposer(min_n, min_n + extra).lookup(tokens, k) == brute(tokens, k, min_n, min_n + extra)


def test_propose_reads_prompt_and_output_and_caps_k():
    r = Request("a", [1, 2, 3, 1, 2], SamplingParams(max_tokens=4), max_model_len=100)
    r.output_token_ids = [3]                                 # sequence 1 2 3 1 2 3 -> "1 2 3" again
    drafts = NgramProposer().propose([r], 8)
    assert drafts[0].token_ids == [1, 2] and drafts[0].probs is None   # max_tokens 4: 3 left, 2 drafts
    r.max_model_len = 7                                      # 6 tokens: room for one more token
    assert NgramProposer().propose([r], 8)[0].token_ids == []


def test_bad_arguments_say_what_is_valid():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramProposer(3, 2)
    with pytest.raises(ValueError, match="1 <= min_n"):
        NgramProposer(0, 2)
