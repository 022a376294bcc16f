"""CUDA-graph bucket rules that need no GPU: the token buckets, which of them get whole-forward
graphs, and the warm-up's dummy prompts for the larger ones."""

from __future__ import annotations

import pytest

from toolkit.worker.cuda_graphs import buckets, whole_forward_buckets
from toolkit.worker.warmup import _prompts


@pytest.mark.parametrize("top", [1, 16, 300, 512, 1000, 8192, 16384])
def test_buckets_pad_by_at_most_a_quarter_above_512(top):
    sizes = buckets(top)
    assert sizes == sorted(set(sizes)) and sizes[-1] == top and sizes[0] == 1
    for lo, hi in zip(sizes, sizes[1:]):
        if lo >= 512:
            assert hi - lo <= lo // 4 + 1, (lo, hi)     # a step of lo + 1 tokens pads by < 25%
        elif lo >= 256:
            assert hi - lo <= 64
        elif lo >= 16:
            assert hi - lo <= 16


def test_whole_forward_buckets_reach_the_largest_decode_step():
    sizes = buckets(8192)
    assert whole_forward_buckets(sizes, 512)[-1] == 512
    assert whole_forward_buckets(sizes, 600)[-1] == 640          # 600 decodes pad into 640
    assert whole_forward_buckets(sizes, None) == sizes
    assert whole_forward_buckets(sizes, 100_000) == sizes
    assert whole_forward_buckets([1, 2, 4], 3) == [1, 2, 4]


@pytest.mark.parametrize("n, longest", [(2048, 512), (640, 640), (700, 256), (5, 4096)])
def test_warm_up_prompts_stay_within_the_model_positions(n, longest):
    prompts = _prompts("w", n, 16, longest)
    assert sum(p.num_new_tokens for p in prompts) == n
    assert all(p.num_new_tokens <= longest and p.start == 0 for p in prompts)
    assert all(len(p.block_ids) * 16 >= p.num_new_tokens for p in prompts)
    assert len({p.request_id for p in prompts}) == len(prompts)
