"""Mixture-of-experts parts: the router (a replicated gate + softmax top-k) and `FusedMoE`, all
experts of a layer in two stacked parameters, computed for every token's selected experts at once.

    w13_weight [E, 2I / N, D]   each expert's gate (w1) rows, then its up (w3) rows: this rank's
                                slice of the intermediate dimension of each
    w2_weight  [E, D, I / N]    each expert's down (w2) columns of the same slice

Tensor parallelism splits every expert's intermediate dimension (as a dense MLP's gate_up /
down): each rank computes its partial sum of every expert's output and one all-reduce after the
down projection adds them (RowParallelLinear's rule). Checkpoints hold one tensor per expert and
projection; the shard id of one is (expert, "w1" | "w3" | "w2") and `expert_shard` maps the
Hugging Face names (Mixtral's w1/w3/w2, Qwen3-MoE's and OLMoE's gate/up/down_proj) to it.

The router is softmax top-k, or DeepSeek-V2/V3's grouped top-k (`GroupedTopK`: the experts in
groups, the best groups kept, an optional selection-only bias `gate.e_score_correction_bias`, a
routed scaling factor). A block may add shared experts (a dense MLP every token runs).

The arithmetic is picked by `kernels` like the model's other ops: the Triton fused kernel on
CUDA (`toolkit/kernels/fused_moe.py`), the sorted torch path on the CPU
(`toolkit/kernels/moe_torch.py`), the per-expert loop twin for "torch".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from toolkit.models.layers.linear import mark, replicated, vector
from toolkit.models.layers.norm import copy_whole
from toolkit.models.layers.parallel import Slice, shape_of, single_process, take

# a checkpoint's per-expert projection names -> the shard's projection
PROJECTIONS = {"w1": "w1", "w3": "w3", "w2": "w2", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>[a-z0-9_]+)\.weight$")
KERNELS = ("auto", "triton", "cpu", "torch")


def expert_shard(name: str) -> tuple[str, tuple[int, str]] | None:
    """`...experts.3.w1.weight` / `...experts.3.gate_proj.weight` -> ("...experts.w13_weight",
    (3, "w1")); None for a name that is not one expert's projection."""
    m = _EXPERT.match(name)
    if m is None or m["proj"] not in PROJECTIONS:
        return None
    proj = PROJECTIONS[m["proj"]]
    param = "w2_weight" if proj == "w2" else "w13_weight"
    return f"{m['prefix']}.{param}", (int(m["e"]), proj)


def experts_impl(device: torch.device, kernels: str) -> tuple[Callable[..., torch.Tensor], Callable[..., Any]]:
    """(fused_experts, select_experts) for a device and a `kernels` choice (toolkit/models/ops.py)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    from toolkit.kernels import moe_torch
    if kernels == "triton" or (kernels == "auto" and device.type == "cuda"):
        from toolkit.kernels.fused_moe import fused_experts
        return fused_experts, moe_torch.select_experts
    if kernels == "torch":
        from toolkit.kernels import reference_moe
        return reference_moe.fused_experts, reference_moe.select_experts
    return moe_torch.fused_experts, moe_torch.select_experts


class FusedMoE(nn.Module):
    """All experts of one layer: x [T, D], routing (weights [T, k], ids [T, k]) -> [T, D],
    all-reduced over the group (reduce_results=False: this rank's partial sum, for a block
    that adds its shared experts' before one all-reduce)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, dtype: torch.dtype,
                 device: torch.device | str, group: Any = None, kernels: str = "auto",
                 reduce_results: bool = True) -> None:
        super().__init__()
        device = torch.device(device)
        self.group = group if group is not None else single_process()
        self.reduce_results = reduce_results
        n = self.group.size
        if intermediate % n:
            raise ValueError(f"the experts' intermediate size {intermediate} does not divide over "
                             f"tensor_parallel_size {n}; valid sizes divide {intermediate}")
        per = intermediate // n
        self.cols = Slice(self.group.rank * per, per)     # this rank's intermediate features
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.impl, _ = experts_impl(device, kernels)
        self.w13_weight = mark(nn.Parameter(torch.empty(num_experts, 2 * per, hidden, dtype=dtype, device=device),
                                            requires_grad=False), self.weight_loader,
                               [((e, p), (intermediate, hidden)) for e in range(num_experts) for p in ("w1", "w3")],
                               "normal")
        self.w2_weight = mark(nn.Parameter(torch.empty(num_experts, hidden, per, dtype=dtype, device=device),
                                           requires_grad=False), self.weight_loader,
                              [((e, "w2"), (hidden, intermediate)) for e in range(num_experts)], "normal")

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any) -> None:
        """Place this rank's part of one expert's checkpoint tensor; shard_id (expert, "w1" |
        "w3" | "w2")."""
        valid = f"(expert in [0, {self.num_experts}), 'w1' | 'w3' | 'w2')"
        if not (isinstance(shard_id, tuple) and len(shard_id) == 2 and shard_id[1] in ("w1", "w3", "w2")
                and isinstance(shard_id[0], int) and 0 <= shard_id[0] < self.num_experts):
            raise ValueError(f"shard {shard_id!r} of the experts is not {valid}")
        e, proj = shard_id
        if (proj == "w2") != (param is self.w2_weight):
            raise ValueError(f"shard {shard_id!r} does not belong in "
                             f"{'w2_weight' if param is self.w2_weight else 'w13_weight'}")
        want = (self.hidden, self.intermediate) if proj == "w2" else (self.intermediate, self.hidden)
        if shape_of(loaded) != want:
            raise ValueError(f"shape mismatch for expert {e} {proj}: checkpoint has {shape_of(loaded)}, "
                             f"the model expects {want}")
        per = self.cols.size
        if proj == "w2":
            param.data[e].copy_(take(loaded, 1, self.cols))                     # [D, I / N]
        else:
            row = 0 if proj == "w1" else per
            param.data[e, row:row + per].copy_(take(loaded, 0, self.cols))      # [I / N, D]

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, D], topk_weights float32 [T, k], topk_ids [T, k] -> [T, D]: this rank's partial
        sum of the selected experts' outputs, then the all-reduce (unless reduce_results is off)."""
        y = self.impl(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids)
        return self.group.all_reduce(y) if self.reduce_results else y

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.cols.size} "
                f"(features {self.cols.start}.. of {self.intermediate}), rank {self.group.rank}/{self.group.size}")


@dataclass(frozen=True)
class GroupedTopK:
    """Grouped top-k routing (vLLM's `use_grouped_topk` options; Hugging Face's n_group,
    topk_group, scoring_func, routed_scaling_factor). `correction_bias`: the gate holds an
    `e_score_correction_bias` [E] (float32) added to the scores for selection only."""
    num_expert_group: int
    topk_group: int
    scoring_func: str = "softmax"
    correction_bias: bool = False
    routed_scaling_factor: float = 1.0


class SparseMoeBlock(nn.Module):
    """The router's gate (replicated [E, D], checkpoint name `gate.weight`), softmax top-k
    (renormalised when `renormalize`) or `grouped` top-k, then the experts, plus the
    `shared_experts` module's output on every token when given: that module returns its
    rank's partial sum (its down projection built with reduce_results=False), added to the
    experts' before the block's one all-reduce."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, intermediate: int, renormalize: bool, *,
                 dtype: torch.dtype, device: torch.device | str, group: Any = None,
                 kernels: str = "auto", grouped: GroupedTopK | None = None,
                 shared_experts: nn.Module | None = None) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}] (the number of "
                             f"experts), got {top_k}")
        self.top_k, self.renormalize, self.grouped = top_k, renormalize, grouped
        # a router with a correction bias (dots.llm1, DeepSeek-V3) scores in float32, its gate
        # kept in float32 as transformers keeps it: bf16 logits pick other experts on near ties
        self.gate_dtype = torch.float32 if grouped is not None and grouped.correction_bias else dtype
        self.gate = replicated(hidden, num_experts, False, dtype=self.gate_dtype, device=device)
        self.experts = FusedMoE(num_experts, hidden, intermediate, dtype=dtype, device=device, group=group,
                                kernels=kernels, reduce_results=shared_experts is None)
        self.shared_experts = shared_experts
        _, self.select = experts_impl(torch.device(device), kernels)
        if grouped is not None:
            from toolkit.kernels import moe_torch, reference_moe
            from toolkit.kernels.reference_moe import check_grouped
            check_grouped(num_experts, top_k, grouped.num_expert_group, grouped.topk_group,
                          grouped.scoring_func, None)
            self.select_grouped = (reference_moe if kernels == "torch" else moe_torch).grouped_topk
            if grouped.correction_bias:
                self.gate.e_score_correction_bias = mark(
                    vector(num_experts, torch.float32, torch.device(device)), self.bias_loader,
                    [(None, (num_experts,))], "zeros")

    def bias_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """`gate.e_score_correction_bias`, whole on every rank, kept in float32."""
        copy_whole(param, loaded, "the router's correction bias")

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] -> (weights float32 [T, k], ids int64 [T, k]); no host sync."""
        g = self.grouped
        if g is None:
            return self.select(logits, self.top_k, self.renormalize)
        bias = self.gate.e_score_correction_bias if g.correction_bias else None
        return self.select_grouped(logits, self.top_k, self.renormalize, num_expert_group=g.num_expert_group,
                                   topk_group=g.topk_group, scoring_func=g.scoring_func,
                                   e_score_correction_bias=bias, routed_scaling_factor=g.routed_scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> [T, D]."""
        weights, ids = self.route(self.gate(x.to(self.gate_dtype)))             # [T, k] x 2
        out = self.experts(x, weights, ids)
        if self.shared_experts is None:
            return out
        return self.experts.group.all_reduce(out + self.shared_experts(x))     # partial sums, one reduce

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}" + (f", {self.grouped}" if self.grouped else "")
