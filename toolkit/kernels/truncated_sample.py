"""Temperature, min-p, top-k, top-p and the exponential race fused in one kernel (Triton).

The sampler's tail (stages temperature -> min_p -> top_k -> top_p, then Gumbel-max) without
writing a processed [N, V] tensor and without computing a top-k / top-p threshold in most rows.
One program per row; y = x / T (round-to-nearest, as torch divides), g = the row's Gumbel
noise (the hash of `gumbel_sample`), and the kept set K = min-p set ∩ top-k set ∩ top-p set.

The race by pivots. Pass 1 reads the row once for its max m (the greedy answer) and for
s = argmax_v (y_v + g_v) over every token. K is "upward closed" (y_v >= y_s and s in K imply
v in K), so if s is in K it is also the argmax over K: the answer. Whether s is in K is one
more pass over the row: #{y > y_s} < k (top-k) and mass{y > y_s} < top_p * mass(K before
top-p) (top-p: s is kept iff the more likely tokens alone fall short of the target). The same
pass computes the next candidate, argmax of y + g over {y > y_s}, so a rejected s costs one
pass, and the pivot only rises. With real models' peaked distributions s is nearly always in
K, so a row costs 1 pass (greedy, or temperature alone) or 2 (with a cut).

The caller may give each top-k row's k-th largest value (the sampler runs torch.topk over
those rows): the top-k cut is then folded into the min-p cut, so a flat row (where a race
over all tokens rarely lands in the top k: about log2(V / k) rounds) costs two passes. Without
it, a row with both top-k and top-p needs mass(top-k set) for the top-p target, and finds its
k-th largest value by the threshold kernel's probe search (about 8 extra passes on one SM).
The twin is `reference_sampling.truncated_sample` (the stages materialised, then the race).
"""

from __future__ import annotations

import torch
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
def _truncated_sample_kernel(x_ptr, stride, n_cols, temp_ptr, greedy_ptr, log_min_p_ptr,
                             top_k_ptr, top_p_ptr, kth_ptr, keys_ptr, out_ptr,
                             HAS_KTH: tl.constexpr, BLOCK: tl.constexpr, NUM_PROBES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * stride
    greedy = tl.load(greedy_ptr + row) != 0
    temp = tl.load(temp_ptr + row)
    k1, k2 = _row_key(keys_ptr, row)

    # pass 1: the max (and the greedy answer), and the race over every token
    best_x = tl.full([BLOCK], float("-inf"), tl.float32)
    best_xi = tl.full([BLOCK], _NO_TOKEN, tl.int32)
    best_s = tl.full([BLOCK], float("-inf"), tl.float32)
    best_si = tl.full([BLOCK], _NO_TOKEN, tl.int32)
    bound = tl.full([], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
        upd = x > best_x                                                   # strict: lowest id
        best_x = tl.where(upd, x, best_x)
        best_xi = tl.where(upd, cols, best_xi)
        if not greedy:
            best_s, best_si, bound = _race_block(tl.div_rn(x, temp), cols, k1, k2,
                                                 x > float("-inf"), best_s, best_si, bound)
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
            best_s = tl.full([BLOCK], float("-inf"), tl.float32)
            best_si = tl.full([BLOCK], _NO_TOKEN, tl.int32)
            bound = tl.full([], float("-inf"), tl.float32)
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
                                                         bound)
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


def truncated_sample(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                     min_p: torch.Tensor | None, top_k: torch.Tensor | None,
                     top_p: torch.Tensor | None, keys: torch.Tensor,
                     kth_largest: torch.Tensor | None = None,
                     *, block: int = 4096, num_warps: int = 16,
                     num_probes: int = 16) -> torch.Tensor:
    """The token of each row: temperature, min-p, top-k, top-p, then the exponential race.

    logits float32 [N, V] (rows contiguous); temperature float32 [N] (read only where not
    greedy); greedy bool [N] (argmax, lowest id on ties); min_p float32 [N] (0 = off) / top_k
    int [N] (<= 0 or >= V = off) / top_p float32 [N] (1 = off), or None when no row uses it;
    keys int64 [N]; kth_largest float32 [N] (optional): the k-th largest logit of each row
    with top-k on (others: anything), when the caller has it (torch.topk over those rows beats
    the kernel's one-SM probe search, and a flat row then needs no rounds for its top-k)
    -> int64 [N]. Equals the stages Temperature, MinP, TopK, TopP and `gumbel_sample` run one
    after another (see the twin). One program of num_warps warps per row, so the slowest row
    sets the kernel's time: many warps keep an SM busy (benchmarks/sampling.py --breakdown
    sweeps block and warps).
    """
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    n, v = logits.shape
    dev = logits.device
    out = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return out
    # log(min_p) by torch, as the MinP stage computes it (the same float32 bits)
    log_min_p = (torch.log(min_p.float()) if min_p is not None
                 else torch.full((n,), float("-inf"), device=dev))
    top_k = top_k if top_k is not None else torch.zeros(n, dtype=torch.int64, device=dev)
    top_p = top_p.float() if top_p is not None else torch.ones(n, device=dev)
    _truncated_sample_kernel[(n,)](
        logits, logits.stride(0), v, temperature.float().contiguous(),
        greedy.to(torch.int8).contiguous(), log_min_p.contiguous(), top_k.contiguous(),
        top_p.contiguous(), kth_largest.float().contiguous() if kth_largest is not None else top_p,
        keys.contiguous(), out, HAS_KTH=kth_largest is not None,
        BLOCK=min(block, triton.next_power_of_2(v)), NUM_PROBES=num_probes, num_warps=num_warps)
    return out
