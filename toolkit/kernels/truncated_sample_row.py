"""The fused tail for one row in one program (`_one_row`): the exact fallback of the split kernel.

`truncated_sample` (kernels/truncated_sample.py) spreads each row over many programs and
decides nearly every row in a fixed number of rounds; a row it leaves undecided (a rare long
chain of rejected pivots, or top-k with top-p and no k-th value given) is finished by its
finalize program with `_one_row`: the same pivot race run to the end inside one program.

The race by pivots. Pass 1 reads the row once for its max m (the greedy answer) and for
s = argmax_v (y_v + g_v) over every token. K is "upward closed" (y_v >= y_s and s in K imply
v in K), so if s is in K it is also the argmax over K: the answer. Whether s is in K is one
more pass over the row: #{y > y_s} < k (top-k) and mass{y > y_s} < top_p * mass(K before
top-p) (top-p: s is kept iff the more likely tokens alone fall short of the target). The same
pass computes the next candidate, argmax of y + g over {y > y_s}, so a rejected s costs one
pass, and the pivot only rises.

Given each top-k row's k-th largest value, the top-k cut is folded into the min-p cut.
Without it, a row with both top-k and top-p needs mass(top-k set) for the top-p target, and
finds its k-th largest value by the threshold kernel's probe search.
"""

from __future__ import annotations

import triton
import triton.language as tl

from toolkit.kernels.gumbel_sample import _race_block, _row_key
from toolkit.kernels.top_k_top_p import _KEY_NEG_INF, _key, _search

_NO_TOKEN = tl.constexpr(2147483647)


@triton.jit
def _argmax_lowest(best, best_idx):
    """(max value, lowest index holding it) of per-lane running maxima."""
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_idx, _NO_TOKEN), axis=0)


@triton.jit
def _race_start(BLOCK: tl.constexpr):
    """Per-lane running maxima (-inf) with their ids (none yet), and the race's bound."""
    return (tl.full([BLOCK], float("-inf"), tl.float32), tl.full([BLOCK], _NO_TOKEN, tl.int32),
            tl.full([], float("-inf"), tl.float32))


@triton.jit
def _one_row(x_ptr, stride, n_cols, row, temp_ptr, greedy_ptr, log_min_p_ptr, top_k_ptr,
             top_p_ptr, kth_ptr, keys_ptr, out_ptr, HAS_KTH: tl.constexpr, BLOCK: tl.constexpr,
             NUM_PROBES: tl.constexpr, FAST: tl.constexpr):
    row_ptr = x_ptr + row * stride
    greedy = tl.load(greedy_ptr + row) != 0
    temp = tl.load(temp_ptr + row)
    k1, k2 = _row_key(keys_ptr, row)

    # pass 1: the max (and the greedy answer), and the race over every token
    best_x, best_xi, _ = _race_start(BLOCK)
    best_s, best_si, bound = _race_start(BLOCK)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
        upd = x > best_x                                                   # strict: lowest id
        best_x = tl.where(upd, x, best_x)
        best_xi = tl.where(upd, cols, best_xi)
        if not greedy:
            best_s, best_si, bound = _race_block(tl.div_rn(x, temp), cols, k1, k2,
                                                 x > float("-inf"), best_s, best_si, bound, FAST)
    m, tok = _argmax_lowest(best_x, best_xi)
    if not greedy:
        k = tl.load(top_k_ptr + row).to(tl.int64)
        p = tl.load(top_p_ptr + row)
        k_on = (k > 0) & (k < n_cols)
        p_on = p < 1.0
        my = tl.div_rn(m, temp)
        lo = my + tl.load(log_min_p_ptr + row)                             # min-p cut on y
        my = tl.where(m == float("-inf"), 0.0, my)                         # exp(y - my) finite
        if HAS_KTH:              # the top-k cut given by the caller: no counting, no rounds for it
            if k_on:
                lo = tl.maximum(lo, tl.div_rn(tl.load(kth_ptr + row), temp))
                k_on = k < 0                                               # folded into lo
        elif k_on & p_on:        # the top-p target needs the top-k set's mass: find its cut
            t_key = _search(row_ptr, n_cols, tl.full([], _KEY_NEG_INF, tl.int64),
                            _key(m).to(tl.int64), m, k.to(tl.float32), False, BLOCK, NUM_PROBES)
            t_key = t_key.to(tl.int32)
            t_x = tl.where(t_key >= 0, t_key, t_key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
            lo = tl.maximum(lo, tl.div_rn(t_x, temp))
            k_on = k < 0                                                   # folded into lo
        _, tok = _argmax_lowest(best_s, best_si)
        y_s = tl.div_rn(tl.load(row_ptr + tl.minimum(tok, n_cols - 1)), temp)
        valid = (tok < n_cols) & (y_s >= lo)
        done = valid & ~(k_on | p_on)
        while not done:
            # one pass: the kept mass Z, the count and mass above the pivot, the next candidate
            piv = tl.where(valid, y_s, float("-inf"))
            z = tl.zeros([BLOCK], dtype=tl.float32)
            above_mass = tl.zeros([BLOCK], dtype=tl.float32)
            above_n = tl.zeros([BLOCK], dtype=tl.int32)
            best_s, best_si, bound = _race_start(BLOCK)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
                y = tl.div_rn(x, temp)
                keep = y >= lo
                e = tl.where(keep, tl.exp(y - my), 0.0)
                z += e
                above = keep & (y > piv)
                above_mass += tl.where(above, e, 0.0)
                above_n += above.to(tl.int32)
                if tl.max(above.to(tl.int32), axis=0) > 0:                 # noise only where needed
                    best_s, best_si, bound = _race_block(y, cols, k1, k2, above, best_s, best_si,
                                                         bound, FAST)
            kept = valid & (~k_on | (tl.sum(above_n, axis=0) < k))
            kept = kept & (~p_on | (tl.sum(above_mass, axis=0) < p * tl.sum(z, axis=0)))
            if kept:
                done = kept
            else:
                _, tok = _argmax_lowest(best_s, best_si)                   # exists: the max is kept
                y_s = tl.div_rn(tl.load(row_ptr + tl.minimum(tok, n_cols - 1)), temp)
                valid = tok < n_cols
                done = ~valid | ~(k_on | p_on)                             # ~valid: nothing left
    tok = tl.where(tok >= n_cols, 0, tok)                                  # a row of only -inf
    tl.store(out_ptr + row, tok.to(tl.int64))
