"""Host-side tile schedule of one step for the paged-attention kernel (built once in plan()).

`build_schedule` builds it with numpy (the decode class, one row per sequence and split, is
what a batch-256 decode step consists of; a Python loop over it cost about 1 ms of host time
per step); `build_schedule_reference` is its twin, a loop per sequence, that the tests hold it
to row for row.

Sequences with few query tokens (decode, short speculative chunks) form the *decode* class:
one tile each, small row blocks, and split-KV (flash-decoding) when too few programs would
fill the GPU. Longer query runs form the *prefill* class: tiles of BLOCK_Q tokens, no split,
the tiles with the most keys first (causal tiles grow along the sequence) for load balance.

causal=False (bidirectional encoders, whose prompts run whole): every row of a sequence sees
all of its keys, so each tile's key range is the one of the sequence's last position; the
work rows keep their true first positions (the kernel, told CAUSAL=False, masks only `< hi`).

Every work item is one row of toolkit.kernels.paged_attention's work table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TileConfig:
    block_q: int        # query tokens per tile; rows per program = block_q * next_pow2(group)
    block_n: int        # keys per inner step
    num_warps: int
    num_stages: int


@dataclass
class Schedule:
    # rows as lists (the reference) or int32 numpy arrays [W, WORK_COLS] / [R, 2] (the fast
    # builder); use len(), not truthiness
    decode: list[list[int]] = field(default_factory=list)     # work rows of the decode launch
    prefill: list[list[int]] = field(default_factory=list)    # work rows of the prefill launch
    # (token, n_splits) per partial row: every decode token, listed even when nothing is split
    # (the eager launch then writes the output directly and ignores them; a CUDA graph's
    # static plan always merges, attention/static_plan.py)
    merge_rows: list[list[int]] = field(default_factory=list)
    num_splits: int = 1                                       # max splits of a decode sequence

    @property
    def split(self) -> bool:
        """Whether some decode sequence's keys are split (then the merge pass runs)."""
        return self.num_splits > 1


def key_ranges(first_pos: int, last_pos: int, window: int | None, block_n: int,
               split_lo: int, split_hi: int) -> tuple[int, int, int, int] | None:
    """(start, full_lo, full_hi, hi) of a tile whose rows sit at positions first..last, limited
    to keys [split_lo, split_hi): keys [full_lo, full_hi) are visible to every row (no mask);
    the rest of [start, hi) is masked. All but hi are multiples of block_n. None: no key."""
    lo = max(split_lo, 0 if window is None else first_pos - window + 1)
    hi = min(split_hi, last_pos + 1)
    if lo >= hi:
        return None
    ulo = max(lo, 0 if window is None else last_pos - window + 1)
    uhi = min(hi, first_pos + 1)
    start = lo // block_n * block_n
    full_lo = -(-ulo // block_n) * block_n
    full_hi = uhi // block_n * block_n
    if full_hi <= full_lo:
        full_lo = full_hi = start
    return start, full_lo, full_hi, hi


def split_size(programs: int, longest: int, *, target_programs: int, min_split_tokens: int,
               max_splits: int, busy_min_split_tokens: int, block_n: int) -> int:
    """Keys per split of a step whose decode sequences make `programs` programs unsplit and
    see at most `longest` keys (1 << 62: no split).

    Splitting pays while programs are few (at batch 1 a long sequence is otherwise one
    program per KV head on a GPU of >100 SMs), but each split adds a partial result to write
    and merge: once the unsplit programs reach half the target, a short split costs more than
    it saves, so a split must then hold busy_min_split_tokens keys; and past some count more
    parts only add merge work, so max_splits caps them. The thresholds are the H200's
    (`python -m benchmarks attention` times split and unsplit decode launches)."""
    if programs >= target_programs:
        return 1 << 62
    want = -(-target_programs // programs)
    if max_splits > 0:
        want = min(want, max_splits)
    least = min_split_tokens
    if busy_min_split_tokens > 0 and 2 * programs >= target_programs:
        least = max(least, busy_min_split_tokens)
    tokens = max(least, -(-longest // want))
    return -(-tokens // block_n) * block_n


def build_schedule_reference(
    qo_indptr: list[int], kv_lens: list[int], kv_indptr: list[int], *, num_kv_heads: int,
    decode: TileConfig, prefill: TileConfig, window: int | None, target_programs: int,
    min_split_tokens: int, max_splits: int = 0, busy_min_split_tokens: int = 0, causal: bool = True,
) -> Schedule:
    """Work tables of one step. Split size is uniform (a multiple of decode.block_n) and chosen
    so that decode programs reach `target_programs`, never below `min_split_tokens` keys
    (`busy_min_split_tokens` when the unsplit programs already reach half the target), and
    the longest sequence in at most `max_splits` parts (0: no cap; +1 where a window
    misaligns them); split_size() is the fast builder's version of the same rule."""
    sched = Schedule()
    seqs = range(len(kv_lens))
    q_lens = [qo_indptr[b + 1] - qo_indptr[b] for b in seqs]
    short = [b for b in seqs if q_lens[b] <= decode.block_q]

    def span(b: int) -> int:                 # keys a decode sequence's rows can see
        first = kv_lens[b] - q_lens[b]
        lo = 0 if window is None else max(0, first - window + 1)
        return kv_lens[b] - lo

    split_tokens = 1 << 62                   # no split
    if short:
        programs = len(short) * num_kv_heads
        if programs < target_programs:
            want = -(-target_programs // programs)
            if max_splits:
                want = min(want, max_splits)
            busy = busy_min_split_tokens and 2 * programs >= target_programs
            least = max(min_split_tokens, busy_min_split_tokens) if busy else min_split_tokens
            longest = max(span(b) for b in short)
            tokens = max(least, -(-longest // want))
            split_tokens = -(-tokens // decode.block_n) * decode.block_n
    part_row = 0
    for b in short:
        first, last = kv_lens[b] - q_lens[b], kv_lens[b] - 1
        lo = 0 if window is None else max(0, first - window + 1)
        s0, s1 = lo // split_tokens, last // split_tokens
        for s in range(s0, s1 + 1):
            r = key_ranges(first if causal else last, last, window, decode.block_n, s * split_tokens,
                           (s + 1) * split_tokens)
            assert r is not None, "every split of a decode sequence holds a key"
            sched.decode.append([qo_indptr[b], q_lens[b], first, kv_indptr[b], *r, part_row, s - s0])
        sched.merge_rows.extend([qo_indptr[b] + i, s1 - s0 + 1] for i in range(q_lens[b]))
        sched.num_splits = max(sched.num_splits, s1 - s0 + 1)
        part_row += q_lens[b]
    # most keys first: the grid runs a row's programs (one a KV head) together, rows in order,
    # so the longest work starts first and short rows fill the last wave (ragged contexts
    # otherwise leave a tail of long programs); stable, so ties keep sequence order
    sched.decode.sort(key=lambda w: w[7] - w[4], reverse=True)

    for b in seqs:
        if q_lens[b] <= decode.block_q:
            continue
        for t0 in range(0, q_lens[b], prefill.block_q):
            n_q = min(prefill.block_q, q_lens[b] - t0)
            first = kv_lens[b] - q_lens[b] + t0
            seen = (first, first + n_q - 1) if causal else (kv_lens[b] - 1, kv_lens[b] - 1)
            r = key_ranges(*seen, window, prefill.block_n, 0, 1 << 62)
            assert r is not None
            sched.prefill.append([qo_indptr[b] + t0, n_q, first, kv_indptr[b], *r, 0, 0])
    sched.prefill.sort(key=lambda w: w[7] - w[4], reverse=True)           # most keys first
    return sched


def max_decode_splits(*, target_programs: int, num_kv_heads: int, min_split_tokens: int,
                      max_tokens_per_seq: int, num_seqs: int = 1, max_splits: int = 0) -> int:
    """The most splits a decode sequence gets in a step of at least num_seqs decode sequences:
    a split holds >= ceil(longest / want) keys with want = ceil(target / (seqs * H_kv))
    (at most max_splits when > 0), and >= min_split_tokens; a sequence's keys may straddle
    one more split boundary (+1)."""
    if target_programs <= 0:
        return 1
    want = -(-target_programs // (num_seqs * num_kv_heads))
    if max_splits > 0:
        want = min(want, max_splits)
    return max(1, min(want + 1, -(-max_tokens_per_seq // min_split_tokens) + 1))


def build_schedule(
    qo_indptr, kv_lens, kv_indptr, *, num_kv_heads: int,
    decode: TileConfig, prefill: TileConfig, window: int | None, target_programs: int,
    min_split_tokens: int, max_splits: int = 0, busy_min_split_tokens: int = 0, causal: bool = True,
) -> Schedule:
    """build_schedule_reference's rows, in the same order, as int32 arrays: the decode class
    vectorised over sequences and splits; prefill tiles (few: long query runs) in a loop."""
    qo = np.asarray(qo_indptr, dtype=np.int64)
    kv = np.asarray(kv_lens, dtype=np.int64)
    kvp = np.asarray(kv_indptr, dtype=np.int64)
    q = qo[1:] - qo[:-1]                                                   # [B]
    short = np.flatnonzero(q <= decode.block_q)                           # decode-class sequences
    sched = Schedule(decode=np.zeros((0, 10), np.int32), prefill=np.zeros((0, 10), np.int32),
                     merge_rows=np.zeros((0, 2), np.int32))
    if short.size:
        qs, ks = q[short], kv[short]
        first, last = ks - qs, ks - 1
        lo = np.zeros_like(first) if window is None else np.maximum(0, first - window + 1)
        split = split_size(short.size * num_kv_heads, int((ks - lo).max()),
                           target_programs=target_programs, min_split_tokens=min_split_tokens,
                           max_splits=max_splits, busy_min_split_tokens=busy_min_split_tokens,
                           block_n=decode.block_n)
        s0, s1 = lo // split, last // split
        n = s1 - s0 + 1                                                    # [S] splits per sequence
        seq = np.repeat(np.arange(short.size), n)                          # [W] owner of each item
        j = np.arange(seq.size) - np.repeat(np.cumsum(n) - n, n)           # [W] split within it
        f, la = first[seq], last[seq]
        k_lo = np.maximum((s0[seq] + j) * split, 0 if window is None else f - window + 1)
        k_hi = np.minimum((s0[seq] + j + 1) * split, la + 1)
        assert (k_lo < k_hi).all(), "every split of a decode sequence holds a key"
        u_lo = np.maximum(k_lo, 0 if window is None else la - window + 1)
        u_hi = np.minimum(k_hi, f + 1) if causal else k_hi                 # bidirectional: all visible
        bn = decode.block_n
        start = k_lo // bn * bn
        full_lo = -(-u_lo // bn) * bn
        full_hi = u_hi // bn * bn
        empty = full_hi <= full_lo
        full_lo = np.where(empty, start, full_lo)
        full_hi = np.where(empty, start, full_hi)
        part = np.cumsum(qs) - qs                                          # [S] first partial row
        b = short[seq]
        rows = np.stack([qo[b], q[b], f, kvp[b], start, full_lo, full_hi, k_hi, part[seq], j], axis=1)
        sched.decode = rows[np.argsort(start - k_hi, kind="stable")].astype(np.int32)   # most keys first
        tok_seq = np.repeat(np.arange(short.size), qs)                     # [R] owner of each token
        tok = qo[short][tok_seq] + np.arange(tok_seq.size) - np.repeat(part, qs)
        sched.merge_rows = np.stack([tok, n[tok_seq]], axis=1).astype(np.int32)
        sched.num_splits = int(n.max())
    long_seqs = np.flatnonzero(q > decode.block_q)
    if long_seqs.size:
        rows = []
        for b in long_seqs.tolist():
            qb, kb, qob, kvpb = int(q[b]), int(kv[b]), int(qo[b]), int(kvp[b])
            for t0 in range(0, qb, prefill.block_q):
                n_q = min(prefill.block_q, qb - t0)
                first_b = kb - qb + t0
                seen = (first_b, first_b + n_q - 1) if causal else (kb - 1, kb - 1)
                r = key_ranges(*seen, window, prefill.block_n, 0, 1 << 62)
                assert r is not None
                rows.append([qob + t0, n_q, first_b, kvpb, *r, 0, 0])
        rows.sort(key=lambda w: w[7] - w[4], reverse=True)                 # most keys first
        sched.prefill = np.asarray(rows, dtype=np.int32).reshape(-1, 10)
    return sched
