"""Which implementation of the model's elementwise ops and LM head runs: Triton (and one cuBLAS GEMM for
the logits) on CUDA, lean torch on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

KERNELS = ("auto", "triton", "cpu", "torch")


@dataclass(frozen=True)
class ModelOps:
    # (x, weight, eps, residual) -> (normed, new residual)
    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (positions, q, k, cos_sin_cache, *, out) -> (q, k)
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (positions, q, k, cos_sin_cache, q_weight, k_weight, eps, *, out) -> (q, k): per-head
    # RMSNorm, then rotary (Qwen3); one launch on CUDA
    qk_norm_rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # x [T, 2I] -> [T, I]
    silu_and_mul: Callable[..., torch.Tensor]
    # (hidden [N, H], weight [V, H]) -> float32 logits [N, V]; one GEMM with an fp32 output on CUDA
    lm_head_logits: Callable[..., torch.Tensor]


def model_ops(device: torch.device | str, kernels: str = "auto") -> ModelOps:
    """kernels="auto": the Triton kernels on a CUDA device, `models/cpu_ops.py` (plain torch, few
    ops, float32 rounding of the twins) otherwise; "triton" / "cpu" / "torch" (the reference
    twins) force one (Triton on the CPU needs TRITON_INTERPRET=1)."""
    from toolkit.kernels import reference_model as ref

    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels == "triton" or (kernels == "auto" and torch.device(device).type == "cuda"):
        from toolkit.kernels.lm_head import lm_head_logits as logits
        from toolkit.kernels.rms_norm import rms_norm
        from toolkit.kernels.rotary import qk_norm_rotary, rotary
        from toolkit.kernels.silu_and_mul import silu_and_mul
    elif kernels == "torch":
        from toolkit.kernels.reference_model import qk_norm_rotary, rms_norm, rotary, silu_and_mul
        logits = ref.lm_head_logits
    else:
        from toolkit.models.cpu_ops import qk_norm_rotary, rms_norm, rotary, silu_and_mul
        logits = ref.lm_head_logits
    return ModelOps(rms_norm=rms_norm, rotary=rotary, qk_norm_rotary=qk_norm_rotary,
                    silu_and_mul=silu_and_mul, lm_head_logits=logits)
