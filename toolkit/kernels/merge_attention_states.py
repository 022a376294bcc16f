"""Merge split-KV partial attention results by their log-sum-exp (Triton), flash-decoding's
second pass: out = sum_s exp(lse_s - m) * o_s / sum_s exp(lse_s - m), m = max_s lse_s.

One program per (partial row, query head). A split whose rows saw no key has lse = -inf and
weighs nothing; every row has at least one split with a finite lse (its own key). A row with
zero splits is padding (a CUDA graph's fixed-size table, attention/static_plan.py): it
writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# S_PAD is the one shape a step's split count changes: `precompile` compiles each power of two
# up to a bound; the LSE strides (S, H * S) are not specialized on, so S itself compiles nothing
@triton.jit(do_not_specialize=["stride_lr", "stride_lh"])
def _merge_attention_states_kernel(
    part_out_ptr, part_lse_ptr, rows_ptr, out_ptr,
    stride_pr, stride_ph, stride_ps, stride_lr, stride_lh, stride_ot, stride_oh,
    S_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    token = tl.load(rows_ptr + 2 * r).to(tl.int64)
    n_splits = tl.load(rows_ptr + 2 * r + 1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_ok = offs_s < n_splits
    r64 = r.to(tl.int64)
    lse = tl.load(part_lse_ptr + r64 * stride_lr + h * stride_lh + offs_s, mask=s_ok,
                  other=float("-inf"))                                     # [S_PAD]
    m = tl.max(lse, 0)
    wgt = tl.where(s_ok, tl.exp(lse - m), 0.0)                             # [S_PAD]
    o = tl.load(part_out_ptr + r64 * stride_pr + h * stride_ph + offs_s[:, None] * stride_ps
                + offs_d[None, :], mask=s_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    res = tl.sum(o * wgt[:, None], 0) / tl.sum(wgt, 0)                     # [D_PAD]
    tl.store(out_ptr + token * stride_ot + h * stride_oh + offs_d,
             res.to(out_ptr.dtype.element_ty), mask=(offs_d < D) & (offs_d * 0 + n_splits > 0))


def merge_attention_states(part_out: torch.Tensor, part_lse: torch.Tensor, rows: torch.Tensor,
                           out: torch.Tensor) -> None:
    """part_out float32 [R, H, S, D], part_lse float32 [R, H, S], rows int32 [R, 2] =
    (output token, number of valid splits) -> out[token, h] for every row r and head h; rows
    with 0 splits write nothing."""
    n_rows, h, s, d = part_out.shape
    if n_rows == 0:
        return
    _merge_attention_states_kernel[(n_rows, h)](
        part_out, part_lse, rows, out,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        S_PAD=max(2, triton.next_power_of_2(s)), D=d, D_PAD=triton.next_power_of_2(d),
        num_warps=4 if d > 64 else 2,
    )


def precompile(num_heads: int, head_dim: int, max_splits: int, out_dtype: torch.dtype,
               device: torch.device) -> None:
    """Compile the merge for every split count up to max_splits (one variant per power of
    two), on one row with no valid split (it writes nothing), so that no step compiles one."""
    rows = torch.zeros(1, 2, dtype=torch.int32, device=device)      # token 0, 0 splits
    out = torch.empty(1, num_heads, head_dim, dtype=out_dtype, device=device)
    s = 2
    while True:
        merge_attention_states(torch.zeros(1, num_heads, s, head_dim, device=device),
                               torch.zeros(1, num_heads, s, device=device), rows, out)
        if s >= max_splits:
            return
        s *= 2
