"""Top-k / top-p threshold per row without sorting the vocabulary (Triton).

One program per row. The answer is a logit value, so it is searched for in the space of
order-preserving int32 keys of float32 (`key(x) = bits(x)` for x >= 0, `bits ^ 0x7fffffff`
below): each pass over the row evaluates NUM_PROBES evenly spaced candidate keys at once
(a count for top-k, an exp-mass for top-p) and narrows the interval ~NUM_PROBES+1 fold, so
32 bits take about 8 passes of V. The result is exact (a logit of the row), with the same
tie rule as the twin `reference_sampling.top_k_top_p_threshold`: all ties at a cut are kept.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_KEY_NEG_INF = tl.constexpr(-2139095041)   # key(-inf): bits 0xff800000 ^ 0x7fffffff as int32


@triton.jit
def _key(x):
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _search(row_ptr, n_cols, lo, hi, m, need, KIND_MASS: tl.constexpr,
            BLOCK: tl.constexpr, NUM_PROBES: tl.constexpr):
    """Largest key t in [lo, hi] with f(t) >= need, f non-increasing, f(lo) >= need assumed.

    f(t) = #{key >= t} (KIND_MASS False) or sum_{key >= t} exp(x - m) (KIND_MASS True).
    """
    j = tl.arange(0, NUM_PROBES) + 1                                  # [P]
    while lo < hi:
        width = hi - lo                                              # int64 scalar
        probes = lo + (width * j + NUM_PROBES) // (NUM_PROBES + 1)   # [P] in (lo, hi]
        acc = tl.zeros([NUM_PROBES], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
            k = _key(x).to(tl.int64)                                  # [B]
            if KIND_MASS:
                w = tl.exp(x - m)
            else:
                w = tl.where(cols < n_cols, 1.0, 0.0)
            hit = k[None, :] >= probes[:, None]                       # [P, B]
            acc += tl.sum(tl.where(hit, w[None, :], 0.0), axis=1)
        ok = acc >= need                                              # [P], a prefix of True
        best = tl.max(tl.where(ok, probes, lo), axis=0)
        nxt = tl.min(tl.where(ok, hi + 1, probes), axis=0)
        lo = best
        hi = nxt - 1
    return lo


@triton.jit
def _top_k_top_p_kernel(logits_ptr, top_k_ptr, top_p_ptr, out_ptr, n_cols, stride,
                        BLOCK: tl.constexpr, NUM_PROBES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride
    k = tl.load(top_k_ptr + row).to(tl.int64)
    p = tl.load(top_p_ptr + row).to(tl.float32)

    m = tl.full([], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=0))
    hi = _key(m).to(tl.int64)
    t = tl.full([], _KEY_NEG_INF, tl.int64)
    if (k > 0) & (k < n_cols):
        t = _search(row_ptr, n_cols, t, hi, m, k.to(tl.float32), False, BLOCK, NUM_PROBES)
    if p < 1.0:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf"))
            total += tl.where(_key(x).to(tl.int64) >= t, tl.exp(x - m_safe), 0.0)
        need = p * tl.sum(total, axis=0)
        t = _search(row_ptr, n_cols, t, hi, m_safe, need, True, BLOCK, NUM_PROBES)
    tl.store(out_ptr + row, t)


def top_k_top_p_threshold(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                          *, block: int = 1024, num_probes: int = 16) -> torch.Tensor:
    """Per-row logit threshold t such that {logits >= t} is the top-k then top-p set.

    logits float32 [N, V] (contiguous rows); top_k int [N] (<= 0 or >= V: off);
    top_p float32 [N] (1: off) -> t float32 [N] (-inf: keep all). See the twin in
    `toolkit.kernels.reference_sampling` for the exact definition.
    """
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    n, v = logits.shape
    keys = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        _top_k_top_p_kernel[(n,)](logits, top_k.contiguous(), top_p.float().contiguous(), keys,
                                  v, logits.stride(0), BLOCK=min(block, triton.next_power_of_2(v)),
                                  NUM_PROBES=num_probes)
    bits = keys.to(torch.int32)
    bits = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)               # key -> float bits
    return bits.view(torch.float32)
