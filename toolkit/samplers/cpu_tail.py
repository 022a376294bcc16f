"""The sampler's race on the CPU: the same tokens as the twins in kernels/reference_sampling.py,
with the Gumbel noise hashed only where a token can win.

The twins hash noise for every token of the vocabulary (int64 hash rounds and two float64
logs over [N, V]); after a top-p / top-k / min-p cut only a few tokens per row are finite,
and the noise of a token depends only on (row key, token id), so computing it for those
tokens alone gives the same winner, ties included (lowest id). A row where most tokens are
kept (temperature-only sampling) takes the twin as it is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from toolkit.kernels import reference_sampling as ref

# race over the kept tokens only when they are at most this fraction of the rows' logits
SPARSE_FRACTION = 0.25


def gumbel_sample(logits: Tensor, keys: Tensor, greedy: Tensor) -> Tensor:
    """argmax(logits + G) per row (greedy rows: argmax(logits)); see `ref.gumbel_sample`.
    logits float32 [N, V] (-inf = excluded), keys int64 [N], greedy bool [N] -> int64 [N]."""
    x = logits.float()
    tokens = torch.argmax(x, dim=-1)                                   # greedy rows; first max
    rows = (~greedy).nonzero().squeeze(1)                              # [R] racing rows
    if rows.numel() == 0:
        return tokens
    sub = x.index_select(0, rows)                                      # [R, V]
    r, c = torch.isfinite(sub).nonzero(as_tuple=True)                  # [M] kept entries
    if r.numel() > SPARSE_FRACTION * sub.numel():
        return ref.gumbel_sample(logits, keys, greedy)
    bits = ref.hash_uniform_bits(keys.index_select(0, rows)[r], c)     # [M], as the twin's [N, V]
    u = (bits.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)
    score = sub[r, c] + (-torch.log(-torch.log(u))).to(torch.float32)  # [M]
    n = rows.numel()
    best = torch.full((n,), float("-inf"), device=x.device).scatter_reduce(0, r, score, "amax")  # [R]
    win = score == best[r]
    col = torch.full((n,), sub.shape[1], dtype=torch.int64, device=x.device).scatter_reduce(
        0, r[win], c[win], "amin")                                     # lowest id among ties
    col = torch.where(col == sub.shape[1], torch.zeros_like(col), col)  # a row of only -inf: 0
    return tokens.index_copy_(0, rows, col)


def truncated_sample(logits: Tensor, temperature: Tensor, greedy: Tensor, min_p: Tensor | None,
                     top_k: Tensor | None, top_p: Tensor | None, keys: Tensor,
                     kth_largest: Tensor | None = None) -> Tensor:
    """`ref.truncated_sample`'s cuts (temperature, min-p, top-k then top-p), then the sparse race."""
    n = logits.shape[0]
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    y = logits.float() / t[:, None]                                    # [N, V]
    if min_p is not None:
        cut = y.amax(dim=-1) + torch.log(min_p.float())
        y = y.masked_fill(y < cut[:, None], float("-inf"))
    if top_k is not None or top_p is not None:
        k = top_k if top_k is not None else torch.zeros(n, dtype=torch.int64, device=y.device)
        p = top_p if top_p is not None else torch.ones(n, device=y.device)
        y = y.masked_fill(y < ref.top_k_top_p_threshold(y, k, p)[:, None], float("-inf"))
    return gumbel_sample(y, keys, greedy)
