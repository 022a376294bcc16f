"""The host-side tile schedule: key ranges cover exactly the visible keys, the unmasked part
is visible to every row, and split pieces tile each decode sequence's keys once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toolkit.attention.schedule import TileConfig, build_schedule, key_ranges


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
    assert s.merge_rows == [[b, len([w for w in s.decode if w[0] == b])] for b in range(len(kv))]
    assert s.split == (s.num_splits > 1)
