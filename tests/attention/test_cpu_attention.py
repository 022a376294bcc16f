"""CPUAttention (the CPU's fast backend) equals its reference twin TorchAttention on ragged
paged batches: decode rows, whole prompts, chunks after a cached prefix, speculative rows,
GQA / MQA, sliding windows, soft caps, custom scales; fp32; outputs written into NaN."""

from __future__ import annotations

import pytest
import torch
from attention_cases import head_geometry, make_case, poisoned_like, ragged_lengths, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.cpu import CPUAttention, _partition
from toolkit.attention.torch_ref import TorchAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout

TOL = 1e-5   # fp32: both compute in fp32, in a different order


def poison_unused_slots(case) -> None:
    """NaN in every cache slot no sequence holds (spare blocks, the tails of last blocks): a
    backend that reads one, even masked, returns NaN (0 * NaN)."""
    bs = case.cache.block_size
    used = torch.zeros(case.cache.num_blocks * bs, dtype=torch.bool)
    for table, kv_len in zip(case.tables, case.kv_lens):
        pos = torch.arange(kv_len)
        used[torch.tensor(table)[pos // bs] * bs + pos % bs] = True
    for layer in case.cache.layers:
        layer.view(2, -1, *layer.shape[3:])[:, ~used] = float("nan")


def both(case, h: int, d: int, layer: int = 0, **opts) -> tuple[torch.Tensor, torch.Tensor]:
    """(fast, reference) outputs of the case's queries; the fast one lands in a NaN buffer."""
    fast, twin = (cls(case.cache, h, d, **opts) for cls in (CPUAttention, TorchAttention))
    fast.plan(case.layout)
    twin.plan(case.layout)
    out = poisoned_like(case.q)
    out.copy_(fast.run(layer, case.q))
    return out, twin.run(layer, case.q)


@settings(max_examples=30, deadline=None)
@given(lengths=ragged_lengths(max_seqs=5, max_kv=70), geom=head_geometry(head_dims=(16, 32)),
       bs=st.sampled_from([4, 16]), seed=st.integers(0, 2**16),
       window=st.one_of(st.none(), st.integers(1, 40)),
       soft_cap=st.one_of(st.none(), st.floats(1.0, 30.0)),
       scale=st.one_of(st.none(), st.floats(0.05, 1.0)))
def test_equals_reference_on_ragged_batches(lengths, geom, bs, seed, window, soft_cap, scale) -> None:
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = make_case(h, h_kv, d, bs, kv_lens, q_lens, torch.float32, seed)
    poison_unused_slots(case)
    out, want = both(case, h, d, sliding_window=window, soft_cap=soft_cap, scale=scale)
    err = rel_err(out, want)
    assert err < TOL, f"relative error {err:.2e}"


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 5), seed=st.integers(0, 2**16),
       prefix=st.lists(st.integers(1, 60), min_size=6, max_size=6))
def test_speculative_rows_beside_decode_and_prefill(n, k, seed, prefix) -> None:
    """Rows verifying k drafts (q_len = 1 + k) mixed with plain decodes and one prompt."""
    kv_lens = [p + 1 + k for p in prefix[:n]] + [5, 33]
    q_lens = [1 + k] * n + [1, 33]
    case = make_case(6, 2, 16, 8, kv_lens, q_lens, torch.float32, seed)
    poison_unused_slots(case)
    out, want = both(case, 6, 16)
    assert rel_err(out, want) < TOL


def test_a_long_prefill_does_not_pad_the_decode_rows() -> None:
    """One 200-token prompt beside 6 decode rows: two groups, each computing what it needs."""
    groups = _partition(torch.tensor([1, 1, 200, 1, 1, 1, 1]).numpy(),
                        torch.tensor([50, 9, 200, 80, 3, 77, 64]).numpy())
    assert sorted(map(len, groups)) == [1, 6] and [2] in [g.tolist() for g in groups]
    case = make_case(4, 1, 32, 16, [50, 9, 200, 80, 3, 77, 64], [1, 1, 200, 1, 1, 1, 1],
                     torch.float32, seed=3)
    out, want = both(case, 4, 32)
    assert rel_err(out, want) < TOL


def test_every_layer_reads_its_own_cache_and_write_kv_matches_the_twin() -> None:
    """Two layers, K/V of the step written through write_kv, then attended."""
    case = make_case(4, 2, 16, 4, [7, 12], [3, 12], torch.float32, seed=5, num_layers=2)
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(15, 2, 16, generator=gen) for _ in range(2))
    twin_cache = KVCache(2, case.cache.num_blocks, 4, 2, 16, torch.float32, "cpu")
    for a, b in zip(twin_cache.layers, case.cache.layers):
        a.copy_(b)
    fast, twin = CPUAttention(case.cache, 4, 16), TorchAttention(twin_cache, 4, 16)
    for attn in (fast, twin):
        attn.plan(case.layout)
        attn.write_kv(1, k, v)
    for a, b in zip(case.cache.layers, twin_cache.layers):
        assert torch.equal(a, b)
    for layer in (0, 1):
        assert rel_err(fast.run(layer, case.q), twin.run(layer, case.q)) < TOL
    assert not torch.allclose(fast.run(0, case.q), fast.run(1, case.q))


def test_padding_sequences_are_never_written() -> None:
    """num_pad_seqs: slots -1 (CUDA-graph padding) are skipped; the real rows are written."""
    cache = KVCache(1, 6, 4, 2, 8, torch.float32, "cpu")
    cache.layers[0].fill_(7.0)
    layout = PagedKVLayout.build([[3, 5]], [6], [2], 4, num_pad_seqs=2)     # T = 4, 2 of them -1
    attn = CPUAttention(cache, 2, 8)
    attn.plan(layout)
    k, v = torch.arange(4.0)[:, None, None].expand(4, 2, 8), -torch.ones(4, 2, 8)
    attn.write_kv(0, k, v)
    flat = cache.layers[0].view(2, -1, 2, 8)
    assert flat[0, 5 * 4 + 0].eq(0).all() and flat[0, 5 * 4 + 1].eq(1).all()   # positions 4, 5
    assert flat[1, 5 * 4:5 * 4 + 2].eq(-1).all()
    written = torch.zeros(24, dtype=torch.bool)
    written[[20, 21]] = True
    assert flat[:, ~written].eq(7.0).all()          # block 0, where pads point, untouched


def test_bad_input_names_the_problem() -> None:
    cache = KVCache(1, 4, 16, 2, 32, torch.float32, "cpu")
    with pytest.raises(ValueError, match="multiple"):
        CPUAttention(cache, 3, 32)
    with pytest.raises(ValueError, match="sliding_window"):
        CPUAttention(cache, 4, 32, sliding_window=0)
    with pytest.raises(ValueError, match="soft_cap"):
        CPUAttention(cache, 4, 32, soft_cap=0.0)
    with pytest.raises(ValueError, match="outside the cache"):
        CPUAttention(cache, 4, 32).plan(PagedKVLayout.build([[1, 4]], [20], [1], 16))
    attn = CPUAttention(cache, 4, 32)
    attn.plan(PagedKVLayout.build([[1]], [3], [3], 16))
    with pytest.raises(ValueError, match="q must be"):
        attn.run(0, torch.zeros(3, 2, 32))
    with pytest.raises(ValueError, match="dtype"):
        attn.run(0, torch.zeros(3, 4, 32, dtype=torch.float64))
