"""The TMA self-attention kernel (causal prefill over a chunk's own contiguous K/V) against its
float32 twin: ragged sequences (tiles that end mid-block, sequences shorter than a tile),
GQA groups, strided q/k/v views of one QKV tensor as the model passes them, the log-sum-exp,
NaN-poisoned outputs. Under TRITON_INTERPRET=1 on the CPU (fp32 / fp16); bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import reference_attention as ref
from toolkit.kernels.self_attention import self_attention, tile_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-2, torch.float16: 2e-2, torch.bfloat16: 3e-2}   # tf32 dots on the GPU


def qkv_views(t: int, h: int, h_kv: int, d: int, dtype, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(t, (h + 2 * h_kv) * d, generator=g).to(dtype).to(DEVICE)
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d:(h + h_kv) * d].view(t, h_kv, d)
    v = qkv[:, (h + h_kv) * d:].view(t, h_kv, d)
    return q, k, v


def run_both(seq_lens, h, h_kv, d, dtype, seed, block_m, block_n):
    q, k, v = qkv_views(sum(seq_lens), h, h_kv, d, dtype, seed)
    tiles = tile_table(seq_lens, block_m, DEVICE)
    out = torch.full(q.shape, float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full(q.shape[:2], float("nan"), device=DEVICE)
    self_attention(q, k, v, tiles, out, lse, scale=d ** -0.5, block_m=block_m, block_n=block_n,
                   num_warps=4, num_stages=2)
    want, want_lse = torch.empty(q.shape, device=DEVICE), torch.empty(q.shape[:2], device=DEVICE)
    ref.self_attention(q, k, v, tiles, want, want_lse, scale=d ** -0.5)
    return out, lse, want, want_lse


@settings(max_examples=12, deadline=None)
@given(seq_lens=st.lists(st.integers(1, 70), min_size=1, max_size=3), group=st.sampled_from([1, 2, 4]),
       h_kv=st.integers(1, 2), d=st.sampled_from([16, 32]), dtype=st.sampled_from([torch.float32, torch.float16]),
       tiles=st.sampled_from([(32, 16), (16, 16), (64, 32)]), seed=st.integers(0, 2**16))
def test_self_attention_matches_twin(seq_lens, group, h_kv, d, dtype, tiles, seed):
    out, lse, want, want_lse = run_both(seq_lens, group * h_kv, h_kv, d, dtype, seed, *tiles)
    assert not out.isnan().any() and not lse.isnan().any(), "an unwritten output row"
    torch.testing.assert_close(out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)


def test_tile_table_puts_the_longest_tiles_first():
    t = tile_table([5, 40], 16, "cpu").tolist()
    assert sorted(t) == sorted([[0, 0, 5], [5, 0, 40], [5, 16, 40], [5, 32, 40]])
    assert [r[1] for r in t] == sorted((r[1] for r in t), reverse=True)


def test_self_attention_rejects_bad_shapes():
    q, k, v = qkv_views(8, 3, 2, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE), torch.empty_like(q), scale=1.0)
    q, k, v = qkv_views(8, 4, 2, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="multiple of block_n"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE), torch.empty_like(q), scale=1.0,
                       block_m=24, block_n=16)


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens", [[4096], [1000, 24, 1777, 1]])
def test_self_attention_gpu_bf16(seq_lens):
    out, lse, want, want_lse = run_both(seq_lens, 32, 8, 128, torch.bfloat16, 0, 128, 64)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])
    torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)
