"""Reference twins of the mixture-of-experts ops: the router's top-k and the experts' per-expert
loop. Slow and obviously correct (float32 throughout, one expert at a time); the oracle of
`toolkit/kernels/fused_moe.py` (Triton) and `toolkit/kernels/moe_torch.py` (the CPU path).

Shapes: T tokens, D hidden, E experts, I intermediate (this rank's share), k experts a token.
    w13 [E, 2I, D]   gate rows [0, I), up rows [I, 2I) of each expert (its w1 | w3)
    w2  [E, D, I]    each expert's down projection
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> None:
    """ValueError unless the shapes agree (the module doc's)."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"x must be [T, D], w13 [E, 2I, D], w2 [E, D, I]; got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    e, two_i, d = w13.shape
    if two_i % 2 or x.shape[1] != d or tuple(w2.shape) != (e, d, two_i // 2):
        raise ValueError(f"w13 {tuple(w13.shape)} must be [E, 2I, D] and w2 {tuple(w2.shape)} [E, D, I] "
                         f"for x {tuple(x.shape)} (D = {x.shape[1]})")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         f"must both be [T, k] with T = {x.shape[0]}")


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, D] -> sum_j topk_weights[t, j] * down_e(silu(gate_e(x)) * up_e(x)) with e = topk_ids[t, j];
    [T, D] in x's dtype. One expert at a time, in float32."""
    check_experts(x, w13, w2, topk_weights, topk_ids)
    i = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)            # [T, D]
    for e in range(w13.shape[0]):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)                      # [n], [n]
        if tok.numel() == 0:
            continue
        h = x[tok].float() @ w13[e].float().T                                   # [n, 2I]
        a = F.silu(h[:, :i]) * h[:, i:]                                         # [n, I]
        y = a @ w2[e].float().T                                                 # [n, D]
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out.to(x.dtype)


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, k], expert ids int64 [T, k]): softmax over the
    experts in float32, the k largest per token (highest first), optionally rescaled to sum to 1.
    Token by token, by a stable sort (ties: the lower expert id first)."""
    t, e = router_logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}] (the number of experts), got {top_k}")
    weights = torch.empty(t, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=router_logits.device)
    for row in range(t):
        p = torch.softmax(router_logits[row].float(), dim=-1)                   # [E]
        order = torch.sort(p, descending=True, stable=True).indices[:top_k]
        ids[row], weights[row] = order, p[order]
        if renormalize:
            weights[row] = weights[row] / weights[row].sum()
    return weights, ids
