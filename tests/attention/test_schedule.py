"""The host-side tile schedule: key ranges cover exactly the visible keys, the unmasked part
is visible to every row, and split pieces tile each decode sequence's keys once."""

from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from toolkit.attention.schedule import (
    TileConfig,
    build_schedule,
    build_schedule_reference,
    key_ranges,
    max_decode_splits,
)
from toolkit.attention.tuning import gpu_config


@given(first=st.integers(0, 300), n_q=st.integers(1, 64), window=st.one_of(st.none(), st.integers(1, 80)),
       block_n=st.sampled_from([16, 32, 64]))
def test_key_ranges_cover_visible_keys(first, n_q, window, block_n) -> None:
    last = first + n_q - 1
    start, full_lo, full_hi, hi = key_ranges(first, last, window, block_n, 0, 1 << 40)
    assert start % block_n == full_lo % block_n == full_hi % block_n == 0
    assert start <= full_lo <= full_hi <= hi == last + 1
    for p in range(first, last + 1):
        visible = {k for k in range(p + 1) if window is None or k > p - window}
        assert visible <= set(range(start, hi))                # nothing visible is skipped
        assert set(range(full_lo, full_hi)) <= visible        # the unmasked part needs no mask


@given(kv=st.lists(st.integers(1, 3000), min_size=1, max_size=5), window=st.one_of(st.none(), st.integers(1, 500)))
def test_splits_tile_each_decode_sequence(kv, window) -> None:
    qo = list(range(len(kv) + 1))
    kvp = [0] * (len(kv) + 1)
    cfg = TileConfig(1, 64, 4, 1)
    s = build_schedule(qo, kv, kvp, num_kv_heads=2, decode=cfg, prefill=TileConfig(8, 64, 4, 1),
                       window=window, target_programs=64, min_split_tokens=64)
    for b, n in enumerate(kv):
        items = [w for w in s.decode if w[0] == b]
        lo = 0 if window is None else max(0, n - window)
        covered = sorted(k for w in items for k in range(max(w[4], lo), w[7]))
        assert covered == list(range(lo, n))                   # every visible key exactly once
        assert sorted(w[9] for w in items) == list(range(len(items)))
    # one merge row per decode token, with its sequence's number of splits
    assert s.merge_rows.tolist() == [[b, len([w for w in s.decode if w[0] == b])] for b in range(len(kv))]
    assert s.split == (s.num_splits > 1)


@given(runs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 400)), min_size=1, max_size=12),
       window=st.one_of(st.none(), st.integers(1, 300)), target=st.sampled_from([0, 8, 64, 1000]),
       block_q=st.sampled_from([1, 4, 8]), kv_heads=st.sampled_from([1, 2, 8]),
       min_split=st.sampled_from([16, 64, 256]), block_n=st.sampled_from([16, 32, 128]),
       max_splits=st.sampled_from([0, 1, 3, 32]), busy=st.sampled_from([0, 32, 512]))
def test_numpy_schedule_equals_the_reference_row_for_row(runs, window, target, block_q, kv_heads,
                                                         min_split, block_n, max_splits, busy) -> None:
    """The fast builder's tables are the reference's, in the same order: ragged mixes of
    decodes, drafts, chunks and prompts, splits on and off, windows."""
    q_lens = [q for q, _ in runs]
    kv = [q + past for q, past in runs]
    qo = [0]
    for q in q_lens:
        qo.append(qo[-1] + q)
    kvp = [0]
    for n in kv:
        kvp.append(kvp[-1] + -(-n // 16))
    args = dict(num_kv_heads=kv_heads, decode=TileConfig(block_q, block_n, 4, 1),
                prefill=TileConfig(16, 32, 4, 1), window=window, target_programs=target,
                min_split_tokens=min_split, max_splits=max_splits, busy_min_split_tokens=busy)
    fast, ref = build_schedule(qo, kv, kvp, **args), build_schedule_reference(qo, kv, kvp, **args)
    assert fast.decode.tolist() == ref.decode
    assert fast.prefill.tolist() == ref.prefill
    assert fast.merge_rows.tolist() == ref.merge_rows
    assert fast.num_splits == ref.num_splits
    keys = [w[7] - w[4] for w in ref.decode]                  # the most keys first (stable)
    assert keys == sorted(keys, reverse=True)


@given(runs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3000)), min_size=1, max_size=12),
       window=st.one_of(st.none(), st.integers(1, 300)), target=st.sampled_from([0, 8, 64, 264, 1000]),
       kv_heads=st.sampled_from([1, 2, 8]), min_split=st.sampled_from([16, 64, 256]),
       block_n=st.sampled_from([16, 32, 128]), block_q=st.sampled_from([1, 4, 8]),
       max_splits=st.sampled_from([0, 2, 32]), busy=st.sampled_from([0, 512]))
@example(runs=[(1, 69)], window=64, target=8, kv_heads=2, min_split=16, block_n=16, block_q=1,
         max_splits=0, busy=0)  # the +1
def test_max_decode_splits_bounds_every_step(runs, window, target, kv_heads, min_split, block_n,
                                             block_q, max_splits, busy) -> None:
    """The bound the warm-up compiles the merge for (every power of two up to it): no step of
    sequences up to max_tokens_per_seq keys splits a sequence more ways, for any batch."""
    q_lens = [q for q, _ in runs]
    kv = [q + past for q, past in runs]
    qo = [0]
    for q in q_lens:
        qo.append(qo[-1] + q)
    s = build_schedule(qo, kv, [0] * len(qo), num_kv_heads=kv_heads,
                       decode=TileConfig(block_q, block_n, 4, 1), prefill=TileConfig(16, 32, 4, 1),
                       window=window, target_programs=target, min_split_tokens=min_split,
                       max_splits=max_splits, busy_min_split_tokens=busy)
    bound = max_decode_splits(target_programs=target, num_kv_heads=kv_heads, min_split_tokens=min_split,
                              max_tokens_per_seq=max(kv), max_splits=max_splits)
    assert s.num_splits <= bound, (s.num_splits, bound)


_H200 = gpu_config(torch.bfloat16, 128, 4, sms=132)            # Llama-3.1-8B's heads, bf16
H200_SPLITS = {"num_kv_heads": 8, "decode": _H200.decode, "prefill": _H200.prefill, "window": None,
               "target_programs": _H200.target_programs, "min_split_tokens": _H200.min_split_tokens,
               "max_splits": _H200.max_splits, "busy_min_split_tokens": _H200.busy_min_split_tokens}


def splits_of(batch: int, context: int) -> int:
    qo, kv = list(range(batch + 1)), [context] * batch
    return build_schedule(qo, kv, [0] * (batch + 1), **H200_SPLITS).num_splits


def test_the_h200_split_rule_at_the_measured_sizes() -> None:
    """The default split rule (attention/tuning.py) gives the split counts that timed best
    on the H200 (benchmarks/RESULTS.md, Attention): the cap and the busy minimum change only
    b1 c16384 (64 -> 32) and b64 c512 (2 -> 1)."""
    assert splits_of(1, 4096) == 16
    assert splits_of(1, 16384) == 32
    assert splits_of(16, 4096) == 5
    assert splits_of(64, 512) == 1
    assert splits_of(64, 4096) == 2
    assert splits_of(256, 512) == 1
    old = dict(H200_SPLITS, max_splits=0, busy_min_split_tokens=0)
    assert build_schedule([0, 1], [16384], [0, 0], **old).num_splits == 64
    assert build_schedule(list(range(65)), [512] * 64, [0] * 65, **old).num_splits == 2
