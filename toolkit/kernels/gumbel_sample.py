"""Sampling by the exponential race (Gumbel-max), fused with its noise (Triton).

One program per row: token = argmax(logits + G) with G = -log(-log u), u from a counter-based
hash of (row key, token id), so no [N, V] noise tensor is written and a seeded row draws the
same token whatever the batch. G is exact in float64; float32 bounds skip it where a block
cannot hold the winner (`_race_block`). Greedy rows take argmax(logits). Ties go to the lowest id.
The twin is `reference_sampling.gumbel_sample`; both use the same hash bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _gumbel(cols, k1, k2):
    """Gumbel(0, 1) noise float32 of token ids `cols` under the row key (k1, k2): the hash
    of `reference_sampling.gumbel_noise`, bit for bit (u in float64 keeps its 32 bits)."""
    h = _fmix32(cols.to(tl.uint32) * 0x9E3779B9 + k1)
    h = _fmix32(h ^ k2)
    u = (h.to(tl.float64) + 0.5) * (1.0 / 4294967296.0)          # (0, 1), exact in f64
    return (-tl.log(-tl.log(u))).to(tl.float32)


@triton.jit
def _log(x, FAST: tl.constexpr):
    """ln x: the hardware's approximate log on the GPU (lg2.approx: absolute error < 2**-21.4
    in [0.5, 2], 3 ulp elsewhere), libm's under the interpreter (it has no libdevice)."""
    if FAST:
        return libdevice.fast_logf(x)
    return tl.log(x)


@triton.jit
def _gumbel_fast(cols, k1, k2, FAST: tl.constexpr):
    """The same noise in float32 arithmetic, within about 3e-5 of `_gumbel` (bound: 1e-3).

    u = (h + 0.5) / 2**32, E = -log u, G = -log E. For u >= 1/2, E is taken from
    w = 1 - u = (~h + 0.5) / 2**32, exact in float32 where 1 - w is not: E = -log1p(-w), by
    its series w + w^2/2 + w^3/3 + w^4/4 below w = 2**-6 (truncation < 1e-8 relative) and
    as -log(1 - w) above (error < 3e-5 relative, E >= 0.0156). Two logs a token.
    """
    h = _fmix32(_fmix32(cols.to(tl.uint32) * 0x9E3779B9 + k1) ^ k2)
    hi = h >= 0x80000000                                     # u >= 1/2
    u = (h.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    w = ((~h).to(tl.float32) + 0.5) * 2.3283064365386963e-10
    series = w * (1.0 + w * (0.5 + w * (0.3333333432674408 + w * 0.25)))
    e = tl.where(hi & (w < 0.015625), series, -_log(tl.where(hi, 1.0 - w, u), FAST))  # Exp(1)
    return -_log(e, FAST)


@triton.jit
def _race_block(y, cols, k1, k2, live, best, best_idx, bound, FAST: tl.constexpr):
    """One block of the race argmax(y + G) (lowest id on ties) over the lanes in `live`.

    The exact float64 noise is costly, so a block first scores with `_gumbel_fast`; only a
    block whose fast score comes within a margin of the best exact score so far (`bound`)
    can hold the winner, and only such blocks pay for the exact noise. Rows usually pass
    a few blocks (each new record), so the race costs about one float32 pass; a block whose
    largest logit is more than the largest possible noise below the record skips even that
    (most of a peaked row).
    """
    margin = 1e-3 + 1e-6 * tl.abs(bound)                 # noise error + two float32 roundings
    # no noise at all where even the largest the hash can give (u = 1 - 2**-33: G < 23) loses
    if tl.max(tl.where(live, y, float("-inf")), axis=0) + 23.0 >= bound - margin:
        fast = tl.where(live, y + _gumbel_fast(cols, k1, k2, FAST), float("-inf"))
        if tl.max(fast, axis=0) >= bound - margin:
            s = tl.where(live, y + _gumbel(cols, k1, k2), float("-inf"))
            upd = s > best                                              # strict: earlier id wins
            best = tl.where(upd, s, best)
            best_idx = tl.where(upd, cols, best_idx)
            bound = tl.maximum(bound, tl.max(s, axis=0))
    return best, best_idx, bound


@triton.jit
def _row_key(keys_ptr, row):
    key = tl.load(keys_ptr + row)                                      # int64
    return (key & 0xFFFFFFFF).to(tl.uint32), ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _gumbel_sample_kernel(logits_ptr, keys_ptr, greedy_ptr, out_ptr, n_cols, stride,
                          BLOCK: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k1, k2 = _row_key(keys_ptr, row)
    noisy = tl.load(greedy_ptr + row) == 0
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    bound = tl.full([], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
        if noisy:
            best, best_idx, bound = _race_block(x, cols, k1, k2, x > float("-inf"), best,
                                                best_idx, bound, FAST)
        else:
            upd = x > best                                             # strict: earlier id wins
            best = tl.where(upd, x, best)
            best_idx = tl.where(upd, cols, best_idx)
    top = tl.max(best, axis=0)
    tok = tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)
    tok = tl.where(tok >= n_cols, 0, tok)                              # a row of only -inf
    tl.store(out_ptr + row, tok.to(tl.int64))


def gumbel_sample(logits: torch.Tensor, keys: torch.Tensor, greedy: torch.Tensor,
                  *, block: int = 1024) -> torch.Tensor:
    """Exponential race / Gumbel-max: argmax(logits + G) per row; greedy rows: argmax(logits).

    logits float32 [N, V] (processed, -inf = excluded), keys int64 [N], greedy bool [N]
    -> token ids int64 [N]. Ties go to the lowest token id; a row of only -inf gives 0.
    """
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    n, v = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        _gumbel_sample_kernel[(n,)](logits, keys.contiguous(), greedy.to(torch.int8).contiguous(),
                                    out, v, logits.stride(0),
                                    BLOCK=min(block, triton.next_power_of_2(v)),
                                    FAST=logits.is_cuda)
    return out
