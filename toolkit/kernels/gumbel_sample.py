"""Sampling by the exponential race (Gumbel-max), fused with its noise (Triton).

One program per row: token = argmax(logits + G) with G = -log(-log u), u from a counter-based
hash of (row key, token id), so no [N, V] noise tensor is written and a seeded row draws the
same token whatever the batch. Greedy rows take argmax(logits). Ties go to the lowest id.
The twin is `reference_sampling.gumbel_sample`; both use the same hash bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _gumbel_sample_kernel(logits_ptr, keys_ptr, greedy_ptr, out_ptr, n_cols, stride,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row)                                      # int64
    k1 = (key & 0xFFFFFFFF).to(tl.uint32)
    k2 = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    noisy = tl.load(greedy_ptr + row) == 0
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
        h = _fmix32(cols.to(tl.uint32) * 0x9E3779B9 + k1)
        h = _fmix32(h ^ k2)
        u = (h.to(tl.float64) + 0.5) * (1.0 / 4294967296.0)          # (0, 1), exact in f64
        g = (-tl.log(-tl.log(u))).to(tl.float32)
        score = tl.where(noisy, x + g, x)
        upd = score > best                                             # strict: earlier id wins
        best = tl.where(upd, score, best)
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
                                    BLOCK=min(block, triton.next_power_of_2(v)))
    return out
