"""Mixture-of-experts ops in plain torch: the router's top-k (every device; no host sync) and
the experts on a CPU device. Same signatures as the twins in `reference_moe.py`.

The experts path sorts the T*k (token, expert) assignments by expert once, runs each expert's
two matmuls on its contiguous run of rows (index_select gathers the tokens), and un-sorts by
one scatter so the weighted sum over k is a plain, deterministic `sum` (no atomics). It reads
the per-expert counts on the host: fine on the CPU, which is the only device it serves (CUDA
runs `fused_moe.py`, which never syncs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from toolkit.kernels.reference_moe import check_experts


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, k], expert ids int64 [T, k]); softmax in
    float32, top-k, optionally renormalised (Hugging Face's order of operations). No host sync."""
    e = router_logits.shape[-1]
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}] (the number of experts), got {top_k}")
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)           # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)                             # [T, k] x 2
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, D] -> [T, D] (module doc), in x's dtype; matmuls in the weights' dtype."""
    check_experts(x, w13, w2, topk_weights, topk_ids)
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1)                                                 # [T*k]
    order = torch.argsort(flat, stable=True)                                    # [T*k] assignment ids
    xs = x.index_select(0, order // k)                                          # [T*k, D] sorted by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()              # host read: CPU only
    ys = torch.empty(t * k, x.shape[1], dtype=x.dtype, device=x.device)         # [T*k, D] sorted
    start = 0
    for e, n in enumerate(counts):
        if n:
            rows = xs[start:start + n]                                          # [n, D]
            a = _silu_and_mul(rows @ w13[e].T)                                  # [n, I]
            torch.mm(a, w2[e].T, out=ys[start:start + n])                       # [n, D]
            start += n
    y = torch.empty_like(ys).index_copy_(0, order, ys)                          # [T*k, D] un-sorted
    w = topk_weights.to(y.dtype).reshape(t, k, 1)
    return (y.view(t, k, -1) * w).sum(dim=1)                                    # [T, D]


def _silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    """h [n, 2I] -> silu(h[:, :I]) * h[:, I:]  [n, I]."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up
