"""The TMA prefill kernel (causal attention of a chunk over its own contiguous K/V and its cached
prefix in the paged cache) against its float32 twin: ragged chunks (tiles that end mid-block,
chunks shorter than a tile), prefixes that end mid-page and mid-tile, shuffled pages, GQA
groups, strided q/k/v views of one QKV tensor as the model passes them, the log-sum-exp,
NaN-poisoned outputs. The twin itself is checked against plain causal attention over the whole
sequence. Under TRITON_INTERPRET=1 on the CPU (fp32 / fp16); bf16 on the GPU."""

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
    assert sorted(t) == sorted([[0, 0, 5, 0, 0], [5, 0, 40, 0, 0], [5, 16, 40, 0, 0], [5, 32, 40, 0, 0]])
    assert [r[1] for r in t] == sorted((r[1] for r in t), reverse=True)
    # a long cached prefix makes a chunk's tiles the longest
    t = tile_table([40, 20], 16, "cpu", prefix_lens=[0, 100], page_base=[0, 7]).tolist()
    assert t[0] == [40, 16, 20, 100, 7] and t[1] == [40, 0, 20, 100, 7]


def prefix_case(chunks, prefixes, h, h_kv, d, page, dtype, seed):
    """The step's q/k/v views for `chunks` new tokens per sequence, and a paged cache [2, NB,
    page, H_kv, D] holding each sequence's `prefixes` tokens on shuffled pages (unused slots
    NaN, so a read past a prefix poisons the output)."""
    q, k, v = qkv_views(sum(chunks), h, h_kv, d, dtype, seed)
    n_pages = [-(-p // page) for p in prefixes]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    cache = torch.full((2, sum(n_pages) + 2, page, h_kv, d), float("nan"), dtype=dtype)
    indices = (torch.randperm(cache.shape[1], generator=g)[: sum(n_pages)] if sum(n_pages)
               else torch.zeros(0, dtype=torch.int64))
    base = 0
    for p, np_ in zip(prefixes, n_pages):
        kv = torch.randn(2, np_ * page, h_kv, d, generator=g).to(dtype)
        kv[:, p:] = float("nan")
        cache[:, indices[base:base + np_]] = kv.view(2, np_, page, h_kv, d)
        base += np_
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    page_base = [sum(n_pages[:i]) for i in range(len(chunks))]
    return q, k, v, cache.to(DEVICE), indices.to(torch.int32).to(DEVICE), starts, page_base


@settings(max_examples=12, deadline=None)
@given(chunks=st.lists(st.integers(1, 50), min_size=1, max_size=3), data=st.data(),
       group=st.sampled_from([1, 2, 4]), page=st.sampled_from([4, 16]),
       dtype=st.sampled_from([torch.float32, torch.float16]),
       tiles=st.sampled_from([(32, 16), (16, 16)]), seed=st.integers(0, 2**16))
def test_chunks_after_a_cached_prefix_match_twin(chunks, data, group, page, dtype, tiles, seed):
    prefixes = data.draw(st.lists(st.integers(0, 60), min_size=len(chunks), max_size=len(chunks)))
    d, h_kv = 16, 2
    q, k, v, cache, indices, starts, page_base = prefix_case(chunks, prefixes, group * h_kv, h_kv, d,
                                                             page, dtype, seed)
    table = tile_table(chunks, tiles[0], DEVICE, starts, prefixes, page_base)
    out = torch.full(q.shape, float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full(q.shape[:2], float("nan"), device=DEVICE)
    self_attention(q, k, v, table, out, lse, scale=d ** -0.5, kv_cache=cache, kv_indices=indices,
                   block_m=tiles[0], block_n=tiles[1], num_warps=4, num_stages=2)
    want, want_lse = torch.empty(q.shape, device=DEVICE), torch.empty(q.shape[:2], device=DEVICE)
    ref.self_attention(q, k, v, table, want, want_lse, scale=d ** -0.5, kv_cache=cache, kv_indices=indices)
    assert not out.isnan().any() and not lse.isnan().any(), "an unwritten row, or a read past a prefix"
    torch.testing.assert_close(out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("chunk,prefix,page", [(5, 0, 4), (7, 13, 4), (20, 32, 16), (1, 3, 16)])
def test_twin_with_a_prefix_is_the_tail_of_whole_sequence_attention(chunk, prefix, page):
    """The twin's chunk rows equal the last rows of plain causal attention (SDPA, math) over
    the prefix and the chunk laid out contiguous: an oracle that shares no code with it."""
    h, h_kv, d = 4, 2, 16
    q, k, v, cache, indices, starts, page_base = prefix_case([chunk], [prefix], h, h_kv, d, page,
                                                             torch.float32, 3)
    out = torch.empty(q.shape, device=DEVICE)
    ref.self_attention(q, k, v, tile_table([chunk], 16, DEVICE, starts, [prefix], page_base), out,
                       scale=d ** -0.5, kv_cache=cache, kv_indices=indices)
    pos = torch.arange(prefix)
    blocks = indices.long().cpu()[pos // page]
    k_all = torch.cat([cache.cpu()[0, blocks, pos % page], k.cpu()])      # [P + S, H_kv, D]
    v_all = torch.cat([cache.cpu()[1, blocks, pos % page], v.cpu()])
    q_all = torch.cat([torch.zeros(prefix, h, d), q.cpu()])               # prefix queries: unused
    want = torch.nn.functional.scaled_dot_product_attention(
        q_all.transpose(0, 1), k_all.transpose(0, 1), v_all.transpose(0, 1), is_causal=True,
        enable_gqa=True).transpose(0, 1)[prefix:]
    torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)


def test_a_prefix_without_a_cache_is_refused_by_the_twin():
    q, k, v = qkv_views(8, 4, 2, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="no kv_cache"):
        ref.self_attention(q, k, v, tile_table([8], 16, DEVICE, prefix_lens=[4]), torch.empty_like(q),
                           scale=1.0)


def test_self_attention_rejects_bad_shapes():
    q, k, v = qkv_views(8, 3, 2, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE), torch.empty_like(q), scale=1.0)
    q, k, v = qkv_views(8, 4, 2, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="multiple of block_n"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE), torch.empty_like(q), scale=1.0,
                       block_m=24, block_n=16)
    with pytest.raises(ValueError, match="tiles must be int32"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE)[:, :3], torch.empty_like(q), scale=1.0)
    with pytest.raises(ValueError, match="kv_cache must be"):
        self_attention(q, k, v, tile_table([8], 16, DEVICE), torch.empty_like(q), scale=1.0,
                       kv_cache=torch.zeros(2, 1, 4, 2, 16, dtype=torch.float16),
                       kv_indices=torch.zeros(1, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens", [[4096], [1000, 24, 1777, 1]])
def test_self_attention_gpu_bf16(seq_lens):
    out, lse, want, want_lse = run_both(seq_lens, 32, 8, 128, torch.bfloat16, 0, 128, 64)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])
    torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("chunks,prefixes", [([512], [4096]), ([300, 64, 1000], [17, 2048, 0])])
def test_chunks_after_a_prefix_gpu_bf16(chunks, prefixes):
    q, k, v, cache, indices, starts, page_base = prefix_case(chunks, prefixes, 32, 8, 128, 16,
                                                             torch.bfloat16, 0)
    table = tile_table(chunks, 64, DEVICE, starts, prefixes, page_base)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEVICE)
    self_attention(q, k, v, table, out, scale=128 ** -0.5, kv_cache=cache, kv_indices=indices,
                   block_m=64, block_n=64, num_warps=4, num_stages=3)
    want = torch.empty(q.shape, device=DEVICE)
    ref.self_attention(q, k, v, table, want, scale=128 ** -0.5, kv_cache=cache, kv_indices=indices)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])
