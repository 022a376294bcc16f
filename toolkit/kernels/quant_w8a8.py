"""W8A8 GEMMs on CUDA: (a_q x a_scale) @ (w_q x w_scale)^T with per-token and per-channel scales.

    M <= SKINNY_MAX_M (decode)  quant_w8a8_skinny's Triton kernel (split-K, weight-bound)

    fp8   torch._scaled_mm (cuBLASLt, row-wise scales: a [M, 1], w [1, N], bf16 output); it
          needs K and N multiples of 16 and a bf16 output, else the twin runs
    int8  torch._int_mm (int32 accumulation; it needs M > 16, so a decode step's rows are
          padded to 32, and K, N multiples of 8) then the two scales in one fp32 epilogue
The twin, reference_quant.scaled_mm, has the same signature and is the CPU path.
"""

from __future__ import annotations

import torch

from toolkit.kernels import reference_quant as ref

# rows up to which the split-K Triton kernel runs instead of cuBLASLt / _int_mm: their tiles
# are for prefill and read the weight slowly at a decode step's few rows. Past 16 rows the
# split-K kernel's weight reads no longer hide its arithmetic and cuBLASLt wins
# (`python -m benchmarks quant_gemm`, "fp8 skinny" against "fp8 lt" at M = 1, 16, 64).
SKINNY_MAX_M = 16


def scaled_mm(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """a_q [M, K], a_scale fp32 [M, 1], w_q [N, K] (fp8 e4m3 or int8, same as a_q), w_scale fp32
    [N] -> [M, N] of out_dtype (+ bias)."""
    if a_q.dtype != w_q.dtype:
        raise ValueError(f"activations and weights must share a quantized dtype, got {a_q.dtype} and {w_q.dtype}")
    m, k = a_q.shape
    n = w_q.shape[0]
    if not a_q.is_cuda:
        return ref.scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype)
    if m <= SKINNY_MAX_M:
        from toolkit.kernels.quant_w8a8_skinny import scaled_mm_skinny

        return scaled_mm_skinny(a_q, a_scale, w_q, w_scale, bias, out_dtype)
    if a_q.dtype == ref.FP8:
        if k % 16 or n % 16 or out_dtype != torch.bfloat16:
            return ref.scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype)
        # w_q [N, K] row-major is the column-major [K, N] operand cuBLASLt wants
        return torch._scaled_mm(a_q, w_q.t(), scale_a=a_scale.float().reshape(m, 1).contiguous(),
                                scale_b=w_scale.float().reshape(1, n).contiguous(), bias=bias,
                                out_dtype=out_dtype)
    if k % 8 or n % 8:
        return ref.scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype)
    a, rows = a_q, m
    if m <= 16:                     # _int_mm's M > 16: zero rows, dropped after
        a = torch.zeros(32, k, dtype=torch.int8, device=a_q.device)
        a[:m] = a_q
    acc = torch._int_mm(a, w_q.t())[:rows]                             # int32 [M, N]
    y = acc.float() * a_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)
