"""PagedKVLayout.build (vectorised) against the per-token definition; BlockTable."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.blocks.block_table import BlockTable
from toolkit.blocks.layout import PagedKVLayout, slot_mapping


@st.composite
def batches(draw):  # -> (block_tables, kv_lens, q_lens, block_size)
    bs = draw(st.sampled_from([1, 3, 16]))
    kv = draw(st.lists(st.integers(1, 60), max_size=5))
    q = [draw(st.integers(1, k)) for k in kv]
    ids = draw(st.permutations(range(320)))    # 5 sequences x (60 + 2) blocks of 1 at most
    tables, used = [], 0
    for k in kv:
        n = -(-k // bs) + draw(st.integers(0, 2))       # tables may be longer than needed
        tables.append(ids[used:used + n])
        used += n
    return tables, kv, q, bs


@given(batches())
def test_build_matches_per_token_definition(batch) -> None:
    tables, kv, q, bs = batch
    lay = PagedKVLayout.build(tables, kv, q, bs)
    want_slots, indices, indptr, last = [], [], [0], []
    for t, k, n in zip(tables, kv, q):
        pages = -(-k // bs)
        want_slots += slot_mapping(t, k - n, k, bs)
        indices += t[:pages]
        indptr.append(len(indices))
        last.append(k - (pages - 1) * bs)
    assert lay.slot_mapping.dtype == torch.int64 and lay.slot_mapping.tolist() == want_slots
    assert lay.kv_indices.dtype == torch.int32 and lay.kv_indices.tolist() == indices
    assert lay.kv_indptr.tolist() == indptr and lay.kv_last_page_len.tolist() == last
    assert lay.q_lens.tolist() == q and lay.kv_lens.tolist() == kv
    assert (lay.num_seqs, lay.num_tokens) == (len(q), sum(q))
    assert lay.max_q_len == max(q, default=0) and lay.max_kv_len == max(kv, default=0)


def test_build_rejects_bad_batches() -> None:
    with pytest.raises(ValueError, match="one entry per sequence"):
        PagedKVLayout.build([[0]], [1, 2], [1], 4)
    with pytest.raises(ValueError, match="1 <= q_len <= kv_len"):
        PagedKVLayout.build([[0]], [2], [3], 4)
    with pytest.raises(ValueError, match="needs 2 blocks"):
        PagedKVLayout.build([[0]], [5], [1], 4)


def test_block_table() -> None:
    t = BlockTable(4)
    assert t.blocks_needed(9) == 3
    t.append_blocks([7, 2, 5])
    t.append_tokens(9)
    assert t.blocks_needed(3) == 0 and t.blocks_needed(4) == 1 and t.num_full_blocks == 2
    assert t.slots(3, 6) == [31, 8, 9] and t.slots(8, 9) == [20]
    with pytest.raises(ValueError, match="do not fit"):
        t.append_tokens(4)
    with pytest.raises(ValueError, match="start <= stop"):
        t.slots(5, 13)
    assert t.clear() == [7, 2, 5] and t.num_tokens == 0


@pytest.mark.gpu
def test_cuda_layout_keeps_its_host_copy():
    """plan() reads the CPU copy build() kept, so it must equal the device tensors."""
    layout = PagedKVLayout.build([[3, 1], [5]], [6, 3], [2, 3], 4, "cuda", num_pad_seqs=2)
    host = layout.host
    assert host.kv_indptr.device.type == "cpu"
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "slot_mapping"):
        assert torch.equal(getattr(host, name), getattr(layout, name).cpu()), name
