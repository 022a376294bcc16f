"""Host-side tile schedule of one step for the paged-attention kernel (built once in plan()).

Sequences with few query tokens (decode, short speculative chunks) form the *decode* class:
one tile each, small row blocks, and split-KV (flash-decoding) when too few programs would
fill the GPU. Longer query runs form the *prefill* class: tiles of BLOCK_Q tokens, no split,
the tiles with the most keys first (causal tiles grow along the sequence) for load balance.

Every work item is one row of toolkit.kernels.paged_attention's work table.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TileConfig:
    block_q: int        # query tokens per tile; rows per program = block_q * next_pow2(group)
    block_n: int        # keys per inner step
    num_warps: int
    num_stages: int


@dataclass
class Schedule:
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


def build_schedule(
    qo_indptr: list[int], kv_lens: list[int], kv_indptr: list[int], *, num_kv_heads: int,
    decode: TileConfig, prefill: TileConfig, window: int | None, target_programs: int,
    min_split_tokens: int,
) -> Schedule:
    """Work tables of one step. Split size is uniform (a multiple of decode.block_n) and chosen
    so that decode programs reach `target_programs`, never below `min_split_tokens` keys."""
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
            longest = max(span(b) for b in short)
            tokens = max(min_split_tokens, -(-longest // want))
            split_tokens = -(-tokens // decode.block_n) * decode.block_n
    part_row = 0
    for b in short:
        first, last = kv_lens[b] - q_lens[b], kv_lens[b] - 1
        lo = 0 if window is None else max(0, first - window + 1)
        s0, s1 = lo // split_tokens, last // split_tokens
        for s in range(s0, s1 + 1):
            r = key_ranges(first, last, window, decode.block_n, s * split_tokens,
                           (s + 1) * split_tokens)
            assert r is not None, "every split of a decode sequence holds a key"
            sched.decode.append([qo_indptr[b], q_lens[b], first, kv_indptr[b], *r, part_row, s - s0])
        sched.merge_rows.extend([qo_indptr[b] + i, s1 - s0 + 1] for i in range(q_lens[b]))
        sched.num_splits = max(sched.num_splits, s1 - s0 + 1)
        part_row += q_lens[b]

    for b in seqs:
        if q_lens[b] <= decode.block_q:
            continue
        for t0 in range(0, q_lens[b], prefill.block_q):
            n_q = min(prefill.block_q, q_lens[b] - t0)
            first = kv_lens[b] - q_lens[b] + t0
            r = key_ranges(first, first + n_q - 1, window, prefill.block_n, 0, 1 << 62)
            assert r is not None
            sched.prefill.append([qo_indptr[b] + t0, n_q, first, kv_indptr[b], *r, 0, 0])
    sched.prefill.sort(key=lambda w: w[7] - w[4], reverse=True)           # most keys first
    return sched
