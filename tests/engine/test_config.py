"""EngineConfig rules that need no model: the CUDA-graph capture limits."""

from __future__ import annotations

import pytest

from toolkit.config import EngineConfig


@pytest.mark.parametrize("kw, tokens", [
    (dict(), 8192),                                                   # every step of the budget
    (dict(max_num_batched_tokens=200), 200),
    (dict(max_cudagraph_capture_size=512), 512),                      # an explicit limit
    (dict(max_cudagraph_capture_size=100_000), 8192),                 # never past the step budget
    (dict(max_num_seqs=512, max_cudagraph_capture_size=64), 64),      # smaller than the decode batch
])
def test_graph_tokens_is_the_largest_captured_step(kw, tokens):
    assert EngineConfig(**kw).graph_tokens == tokens


@pytest.mark.parametrize("kw, tokens", [
    (dict(), 512),                                                    # a prompt chunk beside decodes
    (dict(max_num_seqs=4), 512),
    (dict(max_num_seqs=1024), 1024),                                  # the decode batch
    (dict(max_num_seqs=256, num_speculative_tokens=3, speculative="ngram"), 1024),   # verification rows
    (dict(max_num_seqs=1024, max_num_batched_tokens=512), 512),       # never past the step budget
    (dict(max_num_batched_tokens=200), 200),
    (dict(max_num_seqs=512, max_cudagraph_capture_size=64), 64),      # never past graph_tokens
])
def test_full_graph_tokens_is_the_largest_decode_step(kw, tokens):
    assert EngineConfig(**kw).full_graph_tokens == tokens


@pytest.mark.parametrize("bad, err", [(0, ValueError), (-5, ValueError), (1.5, TypeError), ("512", TypeError),
                                      (True, TypeError)])
def test_bad_capture_limits_say_what_is_valid(bad, err):
    with pytest.raises(err, match="max_cudagraph_capture_size"):
        EngineConfig(max_cudagraph_capture_size=bad)
