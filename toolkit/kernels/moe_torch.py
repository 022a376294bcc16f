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

from toolkit.kernels.reference_moe import check_experts, check_grouped


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


def grouped_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool, *, num_expert_group: int,
                 topk_group: int, scoring_func: str = "softmax",
                 e_score_correction_bias: torch.Tensor | None = None,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2/V3's grouped top-k (the twin's doc: `reference_moe.grouped_topk`), batched:
    router_logits [T, E] -> (weights float32 [T, k], ids int64 [T, k]). Every device, no host
    sync (CUDA-graph safe). Stable descending sorts pick the groups and the experts, so ties go
    to the lower id as in the twin (torch.topk's order under ties is unspecified)."""
    check_grouped(router_logits, top_k, num_expert_group, topk_group, scoring_func, e_score_correction_bias)
    t, e = router_logits.shape
    g, size = num_expert_group, e // num_expert_group
    if scoring_func == "softmax":
        scores = torch.softmax(router_logits, dim=-1, dtype=torch.float32)      # [T, E]
    else:
        scores = torch.sigmoid(router_logits.float())                           # [T, E]
    bias = e_score_correction_bias
    choice = scores if bias is None else scores + bias.float()                  # [T, E] selection only
    per_group = choice.view(t, g, size)                                         # [T, G, E/G]
    if bias is None:
        group_scores = per_group.amax(dim=-1)                                   # [T, G]
    else:
        group_scores = per_group.topk(min(2, size), dim=-1).values.sum(dim=-1)  # [T, G]
    kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    mask = torch.zeros(t, g, dtype=torch.bool, device=scores.device).scatter_(1, kept, True)
    allowed = mask.unsqueeze(-1).expand(t, g, size).reshape(t, e)               # [T, E]
    masked = choice.masked_fill(~allowed, float("-inf"))
    ids = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :top_k]   # [T, k]
    weights = scores.gather(1, ids)                                             # [T, k] unbiased
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids
