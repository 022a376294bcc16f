"""Bad input raises ValueError before any launch, naming what was wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from attention_cases import DEVICE, make_case

from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.attention.tuning import gpu_config
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout


def test_heads_that_do_not_divide() -> None:
    cache = KVCache(1, 4, 16, 4, 64, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        TritonPagedAttention(cache, 6, 64)


def test_head_dim_mismatch() -> None:
    cache = KVCache(1, 4, 16, 2, 64, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        TritonPagedAttention(cache, 4, 128)


def test_block_table_past_the_cache() -> None:
    cache = KVCache(1, 4, 16, 2, 32, torch.float32, DEVICE)
    layout = PagedKVLayout.build([[1, 4]], [20], [1], 16, device=DEVICE)
    with pytest.raises(ValueError, match="outside the cache"):
        TritonPagedAttention(cache, 4, 32).plan(layout)


def test_block_size_mismatch() -> None:
    cache = KVCache(1, 4, 16, 2, 32, torch.float32, DEVICE)
    layout = PagedKVLayout.build([[1, 2]], [40], [1], 32, device=DEVICE)
    with pytest.raises(ValueError, match="block_size"):
        TritonPagedAttention(cache, 4, 32).plan(layout)


def test_dtype_and_shape_mismatch() -> None:
    case = make_case(4, 2, 32, 16, [10], [3], torch.float32)
    attn = TritonPagedAttention(case.cache, 4, 32)
    attn.plan(case.layout)
    with pytest.raises(ValueError, match="dtype"):
        attn.run(0, case.q.half())
    with pytest.raises(ValueError, match="q must be"):
        attn.run(0, case.q[:, :2])
    with pytest.raises(ValueError, match="dtype"):
        attn.write_kv(0, torch.zeros(3, 2, 32, dtype=torch.float16, device=DEVICE),
                      torch.zeros(3, 2, 32, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="out must be"):
        attn.run(0, case.q, out=torch.empty(3, 4, 32, dtype=torch.float16, device=DEVICE))


def test_bad_options() -> None:
    cache = KVCache(1, 4, 16, 2, 32, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="sliding_window"):
        TritonPagedAttention(cache, 4, 32, sliding_window=0)
    with pytest.raises(ValueError, match="soft_cap"):
        TritonPagedAttention(cache, 4, 32, soft_cap=-1.0)
    with pytest.raises(ValueError, match="impl"):
        TritonPagedAttention(cache, 4, 32, impl="cuda")
    base = gpu_config(torch.bfloat16, 128, 4, sms=132)
    for field in ("max_splits", "busy_min_split_tokens"):
        with pytest.raises(ValueError, match="max_splits and busy_min_split_tokens must be >= 0"):
            replace(base, **{field: -1})


def test_run_before_plan() -> None:
    cache = KVCache(1, 4, 16, 2, 32, torch.float32, DEVICE)
    with pytest.raises(RuntimeError, match="plan"):
        TritonPagedAttention(cache, 4, 32).run(0, torch.zeros(1, 4, 32, device=DEVICE))


def test_graphs_follow_the_declared_run_out_capability() -> None:
    """CUDA graphs need run(out=); the engine reads the declaration, not the signature."""
    from toolkit.worker.cuda_graphs import supports_graphs

    class Undeclared:
        def run(self, layer, q, out=None):
            return out

    class Declared(Undeclared):
        supports_run_out = True

    assert not supports_graphs(Undeclared()) and supports_graphs(Declared())
    assert TritonPagedAttention.supports_run_out and not getattr(TorchAttention, "supports_run_out", False)
