"""Temperature, min-p, top-k, top-p and the exponential race fused, each row split over
many programs (Triton).

The sampler's tail (stages temperature -> min_p -> top_k -> top_p, then Gumbel-max) without
writing a processed [N, V] tensor. y = x / T (round-to-nearest, as torch divides), g = the
row's Gumbel noise (the hash of `gumbel_sample`), K = min-p set ∩ top-k set ∩ top-p set, and
the token is argmax over K of y + g (lowest id on ties).

K is upward closed (y_v >= y_s and s in K imply v in K), so the race runs by pivots: race,
check whether the winner s is in K, and if not race again above it (see
`truncated_sample_row`, where one program runs this loop to the end). One program per row
leaves most of the GPU idle and waits on its slowest row, so here a row is cut into chunks of
`chunk` tokens, one program each, and the loop is unrolled into a fixed number of launches:

  round 0  each chunk: its max (and lowest argmax), and the race over its tokens above the
           cuts known beforehand (the caller's k-th largest value for top-k rows): float32
           noise with per-lane records through the chunk (a top-k row's blocks with no token
           above the cut skip it), the exact noise for the few tokens that can win at the
           end (`_race_lanes_exact`: usually one, scored alone).
  round 1  each chunk first derives the row's state after round 0 from its chunk results
           (the max m, hence the min-p cut; the pivot s_1, round 0's winner; every program
           derives it by the same fixed-order reductions, so all agree; the first chunk
           stores it). A decided row returns at once. Otherwise the chunk adds up, above s_1,
           the count (top-k) and the mass (top-p), the kept mass Z, and races above s_1 for
           the next pivot (per-lane records again).
  worklist one program a row: the state after round 1 (was s_1 kept? if not, round 1's race
           winner is the next pivot), stored; the rows still undecided, usually few, go on a
           worklist (an atomic counter).
  round r  r >= 2, on the worklist's rows only, in shorter chunks (the time of a round with
           few rows is one program's): the state after round r-1 (the stored one plus round
           r-1's results), then round 1's work above the new pivot.
  finalize one program per row: the stored state plus the last round's results; it writes
           the decided rows' tokens.

Rows still undecided (pivots rejected in every round: rare, since a race's winner falls
outside a top-p set with probability about 1 - top_p; or top-k with top-p and no k-th value
given) are finished by the finalize program itself, with the one-program-per-row race of
`truncated_sample_row` (one launch for both). The twin is
`reference_sampling.truncated_sample` (the stages materialised, then the race).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.gumbel_sample import _gumbel, _gumbel_fast, _row_key
from toolkit.kernels.prefetch import _load_ahead, _next_block
from toolkit.kernels.truncated_sample_row import _NO_TOKEN, _argmax_lowest, _one_row


@triton.jit
def _row_params(row, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr,
                HAS_KTH: tl.constexpr):
    greedy = tl.load(greedy_ptr + row) != 0
    temp = tl.load(temp_ptr + row)
    k = tl.load(top_k_ptr + row).to(tl.int64)
    p = tl.load(top_p_ptr + row)
    k_on = (k > 0) & (k < n_cols)
    p_on = p < 1.0
    lo_pre = tl.full([], float("-inf"), tl.float32)           # cut known before the max
    if HAS_KTH:                                              # top-k folded into the cut
        lo_pre = tl.where(k_on, tl.div_rn(tl.load(kth_ptr + row), temp), lo_pre)
        k_on = k < 0
    unsupported = k_on & p_on            # the top-p target needs mass(top-k set): row kernel
    return greedy, temp, tl.load(log_min_p_ptr + row), k, k_on, p, p_on, lo_pre, unsupported


@triton.jit
def _best(score_ptr, idx_ptr, base, offs, live):
    """(max score, lowest id holding it) over one row's chunk results."""
    s = tl.load(score_ptr + base + offs, mask=live, other=float("-inf"))
    i = tl.load(idx_ptr + base + offs, mask=live, other=_NO_TOKEN)
    return _argmax_lowest(s, i)


@triton.jit
def _scaled(x, temp):
    """x / T rounded to nearest, as torch divides; T = 1 (exact identity) skips the division."""
    y = x
    if temp != 1.0:
        y = tl.div_rn(x, temp)
    return y


@triton.jit
def _y_at(row_ptr, tok, n_cols, temp):
    return tl.div_rn(tl.load(row_ptr + tl.maximum(tl.minimum(tok, n_cols - 1), 0)), temp)


@triton.jit
def _race_lanes_exact(row_ptr, start0, end0, temp, lo, piv, k1, k2, f1, f1_i, f2,
                      BLOCK: tl.constexpr):
    """The exact race winner (score, id) over the tokens of [start0, end0) with lo <= y, piv < y
    (y = x / T, x > -inf), from per-lane records of their fast scores (`_lane_records`).

    A token's fast and exact scores differ by less than a margin, so only tokens whose fast
    score is within two margins of the top F can win: each lane's record f1, unless some
    lane's runner-up f2 is that close too (rare), and then every token is scored exactly."""
    top_f = tl.max(f1, axis=0)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], _NO_TOKEN, tl.int32)
    if top_f > float("-inf"):
        near = top_f - (2e-3 + 2e-6 * tl.abs(top_f))
        if tl.max(f2, axis=0) >= near:
            for start in range(start0, end0, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(row_ptr + cols, mask=cols < end0, other=float("-inf"))
                y = _scaled(x, temp)
                live = (y >= lo) & (y > piv)                   # y > piv: not -inf
                s = tl.where(live, y + _gumbel(cols, k1, k2), float("-inf"))
                top, top_i = _argmax_lowest(s, cols)
                if top > best:                                   # strict: lower ids win ties
                    best = top
                    best_i = top_i
        else:
            cand = f1 >= near
            if tl.sum(cand.to(tl.int32), axis=0) == 1:     # usual: one candidate, one lane's
                best_i = tl.min(tl.where(cand, f1_i, _NO_TOKEN), axis=0)   # float64 noise
                best = _scaled(tl.load(row_ptr + best_i), temp) + _gumbel(best_i, k1, k2)
            else:
                ids = tl.where(cand, f1_i, 0)
                y = _scaled(tl.load(row_ptr + ids, mask=cand, other=float("-inf")), temp)
                s = tl.where(cand, y + _gumbel(ids, k1, k2), float("-inf"))
                best, best_i = _argmax_lowest(s, tl.where(cand, f1_i, _NO_TOKEN))
    return best, best_i


@triton.jit
def _lane_records(y, cols, live, k1, k2, f1, f1_i, f2, FAST: tl.constexpr):
    """Per-lane records of the fast race score y + G over the `live` tokens: the best f1 with
    its id f1_i (strict: the lane's lowest id on ties) and the runner-up f2. No reductions."""
    f = tl.where(live, y + _gumbel_fast(cols, k1, k2, FAST), float("-inf"))
    new = f > f1
    f2 = tl.where(new, f1, tl.maximum(f2, f))
    return tl.where(new, f, f1), tl.where(new, cols, f1_i), f2


@triton.jit
def _first_state(row_ptr, n_cols, base, offs, live, score_ptr, sidx_ptr, fa_ptr, ia_ptr, temp,
                 greedy, log_min_p, k_on, p_on, lo_pre, unsupported):
    """The row's state after round 0, from its chunk results (max and race winner a chunk):
    (decided, token, pivot, pivot valid, pivot y, kept cut lo, max y)."""
    m, m_tok = _best(fa_ptr, ia_ptr, base, offs, live)
    _, piv = _best(score_ptr, sidx_ptr, base, offs, live)
    my = tl.div_rn(m, temp)
    lo = tl.maximum(lo_pre, my + log_min_p)                            # min-p and top-k cuts
    my = tl.where(m == float("-inf"), 0.0, my)                         # exp(y - my) finite
    y_piv = _y_at(row_ptr, piv, n_cols, temp)
    piv_ok = (piv < n_cols) & (y_piv >= lo)
    decided = greedy | (~unsupported & piv_ok & ~(k_on | p_on))
    tok = tl.where(greedy, m_tok, piv)
    return decided, tok, piv, piv_ok, y_piv, lo, my


@triton.jit
def _next_state(row_ptr, n_cols, base, offs, live, score_ptr, sidx_ptr, fa_ptr, ia_ptr, z_ptr,
                temp, k, k_on, p, p_on, unsupported, decided, tok, piv, piv_ok, y_piv, z,
                FIRST: tl.constexpr):
    """The state after one more round r >= 1, from round r's chunk results (count and mass
    above the pivot, Z when FIRST, the race above the pivot): the pivot is kept, or the race
    winner above it is the next pivot (or the answer, when no check remains)."""
    if FIRST:
        z = tl.sum(tl.load(z_ptr + base + offs, mask=live, other=0.0), axis=0)
    above_mass = tl.sum(tl.load(fa_ptr + base + offs, mask=live, other=0.0), axis=0)
    above_n = tl.sum(tl.load(ia_ptr + base + offs, mask=live, other=0), axis=0)
    _, nxt = _best(score_ptr, sidx_ptr, base, offs, live)
    checks = k_on | p_on
    running = ~decided & ~unsupported
    kept = piv_ok & (~k_on | (above_n < k)) & (~p_on | (above_mass < p * z))
    nxt_ok = nxt < n_cols                        # nothing above a rejected pivot: only -inf
    take_piv = running & kept
    take_nxt = running & ~kept & (~nxt_ok | ~checks)
    tok = tl.where(take_piv, piv, tl.where(take_nxt, nxt, tok))
    decided = decided | take_piv | take_nxt
    moved = running & ~kept
    y_piv = tl.where(moved, _y_at(row_ptr, nxt, n_cols, temp), y_piv)
    piv = tl.where(moved, nxt, piv)
    piv_ok = tl.where(moved, nxt_ok, piv_ok)
    return decided, tok, piv, piv_ok, y_piv, z


@triton.jit
def _state_at(st_i, st_f, r, n_rows, row):
    """The state stored after rounds < r (by round r's first chunk)."""
    bi = st_i + r * 4 * n_rows + row
    bf = st_f + r * 4 * n_rows + row
    return (tl.load(bi) != 0, tl.load(bi + n_rows), tl.load(bi + 2 * n_rows),
            tl.load(bi + 3 * n_rows) != 0, tl.load(bf), tl.load(bf + n_rows),
            tl.load(bf + 2 * n_rows), tl.load(bf + 3 * n_rows))


@triton.jit
def _store_state(st_i, st_f, r, n_rows, row, decided, tok, piv, piv_ok, y_piv, lo, my, z):
    bi = st_i + r * 4 * n_rows + row
    bf = st_f + r * 4 * n_rows + row
    tl.store(bi, decided.to(tl.int32))
    tl.store(bi + n_rows, tok)
    tl.store(bi + 2 * n_rows, piv)
    tl.store(bi + 3 * n_rows, piv_ok.to(tl.int32))
    tl.store(bf, y_piv)
    tl.store(bf + n_rows, lo)
    tl.store(bf + 2 * n_rows, my)
    tl.store(bf + 3 * n_rows, z)


@triton.jit
def _state_after(row_ptr, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr, fa_ptr,
                 ia_ptr, z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on, lo_pre,
                 unsupported, UPTO: tl.constexpr, SPLITS: tl.constexpr):
    """The row's state after rounds 0 .. UPTO-1 (UPTO >= 1): round 0's results, or the state
    stored after rounds < UPTO-1 and round UPTO-1's results (rounds 0 and 1 cut the row into
    n_split chunks, later ones into n_late; every program of a round derives the same state by
    the same fixed-order reductions, and one of them stores it)."""
    offs = tl.arange(0, SPLITS)
    if UPTO - 1 <= 1:
        live = offs < n_split
    else:
        live = offs < n_late
    if UPTO == 1:
        decided, tok, piv, piv_ok, y_piv, lo, my = _first_state(
            row_ptr, n_cols, row * SPLITS, offs, live, score_ptr, sidx_ptr, fa_ptr, ia_ptr, temp,
            greedy, log_min_p, k_on, p_on, lo_pre, unsupported)
        z = tl.full([], 0.0, tl.float32)
    else:
        decided, tok, piv, piv_ok, y_piv, lo, my, z = _state_at(st_i, st_f, UPTO - 1, n_rows, row)
        if ~decided & ~unsupported:
            decided, tok, piv, piv_ok, y_piv, z = _next_state(
                row_ptr, n_cols, ((UPTO - 1) * n_rows + row) * SPLITS, offs, live, score_ptr,
                sidx_ptr, fa_ptr, ia_ptr, z_ptr, temp, k, k_on, p, p_on, unsupported, decided,
                tok, piv, piv_ok, y_piv, z, UPTO - 1 == 1)
    return decided, tok, piv, piv_ok, y_piv, lo, my, z


@triton.jit
def _pivot_chunk(row_ptr, start0, end0, out, temp, lo, my, piv_ok, y_piv, k1, k2, score_ptr,
                 sidx_ptr, fa_ptr, ia_ptr, z_ptr, ROUND: tl.constexpr, BLOCK: tl.constexpr,
                 SKIP: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr,
                 FAST: tl.constexpr):
    """Round ROUND >= 1 on one chunk of an undecided row: above its pivot, the count (top-k)
    and the mass (top-p), the kept mass Z (round 1), and the race for the next pivot (per-lane
    records, the exact noise at the end)."""
    f1 = tl.full([BLOCK], float("-inf"), tl.float32)
    f1_i = tl.full([BLOCK], _NO_TOKEN, tl.int32)
    f2 = tl.full([BLOCK], float("-inf"), tl.float32)
    piv_y = tl.where(piv_ok, y_piv, float("-inf"))
    z = tl.zeros([BLOCK], dtype=tl.float32)
    above_mass = tl.zeros([BLOCK], dtype=tl.float32)
    above_n = tl.zeros([BLOCK], dtype=tl.int32)
    xa, xb = _load_ahead(row_ptr, start0, end0, BLOCK, PREFETCH)
    for start in tl.range(start0, end0, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        x, xa, xb = _next_block(row_ptr, cols, end0, xa, xb, BLOCK, PREFETCH)
        y = _scaled(x, temp)
        keep = y >= lo
        e = tl.where(keep, tl.exp(y - my), 0.0)
        if ROUND == 1:
            z += e
        above = keep & (y > piv_y)                         # the tokens racing: not -inf
        above_mass += tl.where(above, e, 0.0)
        above_n += above.to(tl.int32)
        if SKIP:
            if tl.max(above.to(tl.int32), axis=0) > 0:
                f1, f1_i, f2 = _lane_records(y, cols, above, k1, k2, f1, f1_i, f2, FAST)
        else:
            f1, f1_i, f2 = _lane_records(y, cols, above, k1, k2, f1, f1_i, f2, FAST)
    best, best_i = _race_lanes_exact(row_ptr, start0, end0, temp, lo, piv_y, k1, k2, f1, f1_i,
                                     f2, BLOCK)
    tl.store(fa_ptr + out, tl.sum(above_mass, axis=0))
    tl.store(ia_ptr + out, tl.sum(above_n, axis=0))
    tl.store(z_ptr + out, tl.sum(z, axis=0))
    tl.store(score_ptr + out, best)
    tl.store(sidx_ptr + out, best_i)


# not specialized on the row count: Triton compiles N = 1 apart from other N, so a first
# batch of 3 rows compiled mid-run although the warm-up had run 1, 2, 4, ... rows
@triton.jit(do_not_specialize=["n_rows"])
def _round_kernel(x_ptr, stride, n_cols, n_rows, n_split, n_late, chunk, temp_ptr, greedy_ptr,
                  log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, keys_ptr,
                  score_ptr, sidx_ptr, fa_ptr, ia_ptr, z_ptr, st_i, st_f, work_ptr,
                  ROUND: tl.constexpr, HAS_KTH: tl.constexpr, BLOCK: tl.constexpr,
                  SPLITS: tl.constexpr, SKIP: tl.constexpr, STAGES: tl.constexpr,
                  PREFETCH: tl.constexpr, FAST: tl.constexpr):
    """Rounds 0 and 1: every row, n_split chunks of `chunk` tokens, a program each."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    row_ptr = x_ptr + row * stride
    greedy, temp, log_min_p, k, k_on, p, p_on, lo_pre, unsupported = _row_params(
        row, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, HAS_KTH)
    k1, k2 = _row_key(keys_ptr, row)
    start0 = split * chunk
    end0 = tl.minimum(start0 + chunk, n_cols)
    out = (ROUND * n_rows + row) * SPLITS + split
    if ROUND == 0:
        if (row == 0) & (split == 0):
            tl.store(work_ptr, 0)                       # the later rounds' worklist: empty
        # the race: per-lane records of the fast score (best f1 with its id, runner-up f2), no
        # block reductions in the loop; the exact noise at the end (`_race_lanes_exact`)
        f1 = tl.full([BLOCK], float("-inf"), tl.float32)
        f1_i = tl.full([BLOCK], _NO_TOKEN, tl.int32)
        f2 = tl.full([BLOCK], float("-inf"), tl.float32)
        best_x = tl.full([BLOCK], float("-inf"), tl.float32)
        best_xi = tl.full([BLOCK], _NO_TOKEN, tl.int32)
        race = ~greedy & ~unsupported
        cut = lo_pre > float("-inf")            # a top-k row: few tokens race, most blocks none
        xa, xb = _load_ahead(row_ptr, start0, end0, BLOCK, PREFETCH)
        for start in tl.range(start0, end0, BLOCK, num_stages=STAGES):
            cols = start + tl.arange(0, BLOCK)
            x, xa, xb = _next_block(row_ptr, cols, end0, xa, xb, BLOCK, PREFETCH)
            upd = x > best_x                                               # strict: lowest id
            best_x = tl.where(upd, x, best_x)
            best_xi = tl.where(upd, cols, best_xi)
            if race:
                y = _scaled(x, temp)
                live = (y > float("-inf")) & (y >= lo_pre)
                if SKIP & cut:
                    if tl.max(live.to(tl.int32), axis=0) > 0:
                        f1, f1_i, f2 = _lane_records(y, cols, live, k1, k2, f1, f1_i, f2, FAST)
                else:
                    f1, f1_i, f2 = _lane_records(y, cols, live, k1, k2, f1, f1_i, f2, FAST)
        best = tl.full([], float("-inf"), tl.float32)
        best_i = tl.full([], _NO_TOKEN, tl.int32)
        if race:
            best, best_i = _race_lanes_exact(row_ptr, start0, end0, temp, lo_pre,
                                             float("-inf"), k1, k2, f1, f1_i, f2, BLOCK)
        m, m_tok = _argmax_lowest(best_x, best_xi)
        tl.store(fa_ptr + out, m)
        tl.store(ia_ptr + out, m_tok)
        tl.store(score_ptr + out, best)
        tl.store(sidx_ptr + out, best_i)
    else:
        decided, tok, piv, piv_ok, y_piv, lo, my, z = _state_after(
            row_ptr, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr, fa_ptr, ia_ptr,
            z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on, lo_pre, unsupported,
            1, SPLITS)
        if split == 0:                  # for the next round, which then adds one round's step
            _store_state(st_i, st_f, 1, n_rows, row, decided, tok, piv, piv_ok, y_piv, lo, my, z)
        if ~decided & ~unsupported:
            _pivot_chunk(row_ptr, start0, end0, out, temp, lo, my, piv_ok, y_piv, k1, k2,
                         score_ptr, sidx_ptr, fa_ptr, ia_ptr, z_ptr, 1, BLOCK, SKIP, STAGES,
                         PREFETCH, FAST)


@triton.jit(do_not_specialize=["n_rows"])          # as _round_kernel
def _worklist_kernel(x_ptr, stride, n_cols, n_rows, n_split, n_late, temp_ptr, greedy_ptr,
                     log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, score_ptr, sidx_ptr, fa_ptr,
                     ia_ptr, z_ptr, st_i, st_f, work_ptr, HAS_KTH: tl.constexpr,
                     SPLITS: tl.constexpr):
    """One program a row, after round 1: its state after rounds 0 and 1, stored; a row still
    undecided (and racing) is appended to the worklist the later rounds run on."""
    row = tl.program_id(0).to(tl.int64)
    greedy, temp, log_min_p, k, k_on, p, p_on, lo_pre, unsupported = _row_params(
        row, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, HAS_KTH)
    decided, tok, piv, piv_ok, y_piv, lo, my, z = _state_after(
        x_ptr + row * stride, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr, fa_ptr,
        ia_ptr, z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on, lo_pre,
        unsupported, 2, SPLITS)
    _store_state(st_i, st_f, 2, n_rows, row, decided, tok, piv, piv_ok, y_piv, lo, my, z)
    if ~decided & ~unsupported:
        slot = tl.atomic_add(work_ptr, 1)                 # the order does not matter
        tl.store(work_ptr + 1 + slot, row.to(tl.int32))


# row counts move every step (n_slots = min(N, late_rows)): not specialized on, so an N the
# warm-up's batch sizes did not cover compiles nothing mid-run
@triton.jit(do_not_specialize=["n_rows", "n_slots"])
def _late_kernel(x_ptr, stride, n_cols, n_rows, n_split, n_late, chunk, temp_ptr, greedy_ptr,
                 log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, keys_ptr, score_ptr, sidx_ptr,
                 fa_ptr, ia_ptr, z_ptr, st_i, st_f, work_ptr, n_slots,
                 ROUND: tl.constexpr, HAS_KTH: tl.constexpr, BLOCK: tl.constexpr,
                 SPLITS: tl.constexpr, SKIP: tl.constexpr, STAGES: tl.constexpr,
                 PREFETCH: tl.constexpr, FAST: tl.constexpr):
    """Round ROUND >= 2, on the worklist's rows only (the rows round 1 left undecided; few):
    program (split, slot) takes the chunk `split` of `chunk` tokens of worklist entries slot,
    slot + n_slots, ... A row decided since returns after its state (one round's step)."""
    split = tl.program_id(0)
    start0 = split * chunk
    end0 = tl.minimum(start0 + chunk, n_cols)
    for i in range(tl.program_id(1), tl.load(work_ptr), n_slots):
        row = tl.load(work_ptr + 1 + i).to(tl.int64)
        row_ptr = x_ptr + row * stride
        greedy, temp, log_min_p, k, k_on, p, p_on, lo_pre, unsupported = _row_params(
            row, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr,
            HAS_KTH)
        if ROUND == 2:                                  # stored by the worklist kernel
            decided, tok, piv, piv_ok, y_piv, lo, my, z = _state_at(st_i, st_f, 2, n_rows, row)
        else:
            decided, tok, piv, piv_ok, y_piv, lo, my, z = _state_after(
                row_ptr, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr, fa_ptr,
                ia_ptr, z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on, lo_pre,
                unsupported, ROUND, SPLITS)
            if split == 0:
                _store_state(st_i, st_f, ROUND, n_rows, row, decided, tok, piv, piv_ok, y_piv,
                             lo, my, z)
        if ~decided:
            k1, k2 = _row_key(keys_ptr, row)
            _pivot_chunk(row_ptr, start0, end0, (ROUND * n_rows + row) * SPLITS + split, temp,
                         lo, my, piv_ok, y_piv, k1, k2, score_ptr, sidx_ptr, fa_ptr, ia_ptr,
                         z_ptr, ROUND, BLOCK, SKIP, STAGES, PREFETCH, FAST)


@triton.jit(do_not_specialize=["n_rows"])          # as _round_kernel
def _finalize_kernel(x_ptr, stride, n_cols, n_rows, n_split, n_late, temp_ptr, greedy_ptr,
                     log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, keys_ptr, score_ptr, sidx_ptr,
                     fa_ptr, ia_ptr, z_ptr, st_i, st_f, out_ptr, ROUNDS: tl.constexpr,
                     HAS_KTH: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                     NUM_PROBES: tl.constexpr, FAST: tl.constexpr):
    """One program per row: the state after every round; a decided row's token is written, a
    row left undecided is finished here by the one-program-per-row race (`_one_row`)."""
    row = tl.program_id(0).to(tl.int64)
    greedy, temp, log_min_p, k, k_on, p, p_on, lo_pre, unsupported = _row_params(
        row, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr, top_p_ptr, kth_ptr, HAS_KTH)
    if ROUNDS <= 1:
        decided, tok, _, _, _, _, _, _ = _state_after(
            x_ptr + row * stride, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr,
            fa_ptr, ia_ptr, z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on, lo_pre,
            unsupported, ROUNDS + 1, SPLITS)
    else:                       # every row's state after round 1; the worklist's rows go on
        decided, tok, _, _, _, _, _, _ = _state_at(st_i, st_f, 2, n_rows, row)
        if ~decided & ~unsupported:
            decided, tok, _, _, _, _, _, _ = _state_after(
                x_ptr + row * stride, n_cols, row, n_rows, n_split, n_late, score_ptr, sidx_ptr,
                fa_ptr, ia_ptr, z_ptr, st_i, st_f, temp, greedy, log_min_p, k, k_on, p, p_on,
                lo_pre, unsupported, ROUNDS + 1, SPLITS)
    if decided:
        tl.store(out_ptr + row, tl.where(tok >= n_cols, 0, tok).to(tl.int64))   # only -inf: 0
    else:
        _one_row(x_ptr, stride, n_cols, row, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr,
                 top_p_ptr, kth_ptr, keys_ptr, out_ptr, HAS_KTH, BLOCK, NUM_PROBES, FAST)


def truncated_sample(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                     min_p: torch.Tensor | None, top_k: torch.Tensor | None,
                     top_p: torch.Tensor | None, keys: torch.Tensor,
                     kth_largest: torch.Tensor | None = None,
                     *, chunk: int = 8192, late_chunk: int = 2048, late_rows: int = 32,
                     block: int = 512, num_warps: int = 4, rounds: int = 5, skip: bool = True,
                     stages: int = 3, prefetch: int = 1,
                     row_block: int = 4096, row_warps: int = 16,
                     num_probes: int = 16) -> torch.Tensor:
    """The token of each row: temperature, min-p, top-k, top-p, then the exponential race.

    logits float32 [N, V] (rows contiguous); temperature float32 [N] (read only where not
    greedy); greedy bool [N] (argmax, lowest id on ties); min_p float32 [N] (0 = off) / top_k
    int [N] (<= 0 or >= V = off) / top_p float32 [N] (1 = off), or None when no row uses it;
    keys int64 [N]; kth_largest float32 [N] (optional): the k-th largest logit of each row
    with top-k on (others: anything), when the caller has it (`kernels.kth_largest`: a group
    filter over those rows): the top-k cut then costs no rounds -> int64 [N]. Equals the stages
    Temperature, MinP, TopK, TopP and `gumbel_sample` run one after another (see the twin).

    Tuning: chunk tokens per program (block at a time, num_warps warps; the loop pipelined
    over `stages`, and `prefetch` blocks, 0-2, loaded ahead of the one being worked on);
    rounds from 2 on run on the rows round 1 left undecided, late_chunk tokens a program and
    late_rows rows at a time (more rows wait their turn in the same programs);
    `rounds` pivot checks before the finalize kernel's row race (row_block, row_warps,
    num_probes) takes the rows left; skip: a block with no racing token computes no noise.
    """
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    powers = not (block & (block - 1) or row_block & (row_block - 1))
    if rounds < 0 or prefetch not in (0, 1, 2) or not powers:
        raise ValueError(f"rounds must be >= 0, prefetch 0, 1 or 2, and block, row_block powers "
                         f"of two; got rounds={rounds}, prefetch={prefetch}, block={block}, "
                         f"row_block={row_block}")
    n, v = logits.shape
    dev = logits.device
    out = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return out
    # log(min_p) by torch, as the MinP stage computes it (the same float32 bits)
    log_min_p = (torch.log(min_p.float()) if min_p is not None
                 else torch.full((n,), float("-inf"), device=dev)).contiguous()
    top_k = (top_k if top_k is not None else torch.zeros(n, dtype=torch.int64, device=dev)).contiguous()
    top_p = (top_p.float() if top_p is not None else torch.ones(n, device=dev)).contiguous()
    kth = kth_largest.float().contiguous() if kth_largest is not None else top_p
    temperature = temperature.float().contiguous()
    greedy = greedy.to(torch.int8).contiguous()
    keys = keys.contiguous()
    block = min(block, triton.next_power_of_2(v))
    chunk = triton.cdiv(max(chunk, block), block) * block
    late_chunk = triton.cdiv(max(late_chunk, block), block) * block
    n_split, n_late = triton.cdiv(v, chunk), triton.cdiv(v, late_chunk)
    splits = triton.next_power_of_2(max(n_split, n_late))
    # chunk results [round, row, chunk]: race score / id, max or mass above / its id or count, Z
    f32 = torch.empty(3, rounds + 1, n, splits, dtype=torch.float32, device=dev)
    i32 = torch.empty(2, rounds + 1, n, splits, dtype=torch.int32, device=dev)
    parts = (f32[0], i32[0], f32[1], i32[1], f32[2])
    # the row's state after rounds < r [r, field, row]: (decided, token, pivot, pivot valid)
    # and (pivot y, cut lo, max y, Z); r = 0 unused
    state = (torch.empty(rounds + 1, 4, n, dtype=torch.int32, device=dev),
             torch.empty(rounds + 1, 4, n, dtype=torch.float32, device=dev))
    work = torch.empty(n + 1, dtype=torch.int32, device=dev)    # [count, rows] after round 1
    rows = (temperature, greedy, log_min_p, top_k, top_p, kth)
    common = dict(HAS_KTH=kth_largest is not None, BLOCK=block, SPLITS=splits, SKIP=skip,
                  STAGES=stages, PREFETCH=prefetch, FAST=logits.is_cuda, num_warps=num_warps)
    sizes = (logits, logits.stride(0), v, n, n_split, n_late)
    for r in range(min(rounds, 1) + 1):
        _round_kernel[(n, n_split)](*sizes, chunk, *rows, keys, *parts, *state, work, ROUND=r,
                                    **common)
    if rounds >= 2:                 # later rounds: the rows still undecided, shorter chunks
        _worklist_kernel[(n,)](*sizes, *rows, *parts, *state, work, HAS_KTH=common["HAS_KTH"],
                               SPLITS=splits)
        slots = max(1, min(n, late_rows))
        for r in range(2, rounds + 1):
            _late_kernel[(n_late, slots)](*sizes, late_chunk, *rows, keys, *parts, *state, work,
                                          slots, ROUND=r, **common)
    _finalize_kernel[(n,)](*sizes, *rows, keys, *parts, *state, out, ROUNDS=rounds,
                           HAS_KTH=common["HAS_KTH"], SPLITS=splits,
                           BLOCK=min(row_block, triton.next_power_of_2(v)), NUM_PROBES=num_probes,
                           FAST=logits.is_cuda, num_warps=row_warps)
    return out
