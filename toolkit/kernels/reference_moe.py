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


def check_grouped(router_logits: torch.Tensor | int, top_k: int, num_expert_group: int, topk_group: int,
                  scoring_func: str, e_score_correction_bias: torch.Tensor | None) -> None:
    """ValueError unless the grouped top-k's options fit the logits [T, E], or E experts when
    given an int (`grouped_topk`'s doc)."""
    if isinstance(router_logits, int):
        e = router_logits
    elif router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [T, E], got {tuple(router_logits.shape)}")
    else:
        e = router_logits.shape[1]
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(f"scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}")
    if num_expert_group < 1 or e % num_expert_group:
        raise ValueError(f"n_group {num_expert_group} must be >= 1 and divide the {e} experts")
    if not 1 <= topk_group <= num_expert_group:
        raise ValueError(f"topk_group must be in [1, {num_expert_group}] (n_group), got {topk_group}")
    reach = topk_group * (e // num_expert_group)
    if not 1 <= top_k <= reach:
        raise ValueError(f"top_k must be in [1, {reach}] (topk_group x experts per group), got {top_k}")
    if e_score_correction_bias is not None and tuple(e_score_correction_bias.shape) != (e,):
        raise ValueError(f"e_score_correction_bias must be [E] = [{e}], got {tuple(e_score_correction_bias.shape)}")


def grouped_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool, *, num_expert_group: int,
                 topk_group: int, scoring_func: str = "softmax",
                 e_score_correction_bias: torch.Tensor | None = None,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2/V3's grouped routing: router_logits [T, E] -> (weights float32 [T, k], expert
    ids int64 [T, k]).

    Per token: scores = softmax or sigmoid of the logits (float32); the choice scores add
    `e_score_correction_bias` [E] when given. The E experts form `num_expert_group` equal groups
    in id order; a group's score is its best choice score (no bias) or the sum of its best two
    (with a bias; its one score in a group of one). The `topk_group` best groups stay; the k best
    choice scores among their experts are the ids (highest first). The weights are the *scores*
    of those ids (never the bias), divided by their sum (+1e-20) when `renormalize`, then times
    `routed_scaling_factor`. Ties go to the lower group / expert id. Token by token."""
    check_grouped(router_logits, top_k, num_expert_group, topk_group, scoring_func, e_score_correction_bias)
    t, e = router_logits.shape
    size = e // num_expert_group
    weights = torch.empty(t, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=router_logits.device)
    for row in range(t):
        logit = router_logits[row].float()                                      # [E]
        s = torch.softmax(logit, dim=-1) if scoring_func == "softmax" else torch.sigmoid(logit)
        choice = s if e_score_correction_bias is None else s + e_score_correction_bias.float()
        best = []                                                               # (group score, group)
        for grp in range(num_expert_group):
            vals = sorted(choice[grp * size:(grp + 1) * size].tolist(), reverse=True)
            top = torch.tensor(vals[:1] if e_score_correction_bias is None else vals[:2])   # float32
            score = top.sum().item()
            best.append((-score, grp))
        kept = [grp for _, grp in sorted(best)[:topk_group]]
        cands = sorted((-choice[x].item(), x) for grp in kept for x in range(grp * size, (grp + 1) * size))
        chosen = [x for _, x in cands[:top_k]]
        w = s[chosen]
        if renormalize:
            w = w / (w.sum() + 1e-20)
        ids[row], weights[row] = torch.tensor(chosen), w * routed_scaling_factor
    return weights, ids
