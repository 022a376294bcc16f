"""The LM head on CUDA: one cuBLAS GEMM that writes float32 logits.

A bf16/fp16 `F.linear(hidden, weight).float()` writes [N, V] logits in the half type and then
reads them back to convert: at batch 256 that is two logits-sized passes more than the GEMM
needs (Qwen3-0.6B's 152k vocabulary: 235 us against 142 us for the GEMM with an fp32
epilogue, H200, benchmarks/fused_ops.py). torch.mm(..., out_dtype=float32) (aten::mm.dtype,
CUDA, torch >= 2.8) keeps cuBLAS's fp32 accumulator instead of rounding it to the half type
first, so the logits are also closer to the exact product (the twin,
`reference_model.lm_head_logits`, rounds like Hugging Face: half product, then float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from toolkit.kernels.reference_model import check_logits_out

HALF = (torch.bfloat16, torch.float16)


def has_fp32_out_mm() -> bool:
    """Whether this torch has the fp32-output overload of mm (torch >= 2.8)."""
    return hasattr(torch.ops.aten.mm, "dtype")


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor, *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [N, H], weight [V, H] (same dtype) -> float32 logits [N, V] (into `out`, a
    contiguous float32 [N, V], when given: a CUDA graph's static buffer).

    CUDA half inputs (torch >= 2.8): one GEMM with a float32 output; anything else: the twin's
    two steps (float32 inputs give the same float32 GEMM either way)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    check_logits_out(out, hidden.shape[0], weight.shape[0])
    if hidden.is_cuda and hidden.dtype in HALF and weight.dtype == hidden.dtype and has_fp32_out_mm():
        if out is None:
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return torch.mm(hidden, weight.t(), out_dtype=torch.float32, out=out)
    logits = F.linear(hidden, weight).float()
    return logits if out is None else out.copy_(logits)
