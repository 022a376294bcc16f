"""The experts of a mixture-of-experts layer in two Triton launches (vLLM's fused-MoE design).

1. `moe_align_block_size` (torch ops, no host sync): the T*k (token, expert) assignments
   sorted by expert, each expert's run padded to a multiple of BLOCK_M so every block of rows
   belongs to one expert. sorted_ids [P] holds assignment ids (T*k = padding), block_expert
   [P / BLOCK_M] each block's expert, num_padded [1] how many rows are real blocks. P is a
   static bound (T*k + min(E, T*k) * (BLOCK_M - 1), rounded up), so the grid never depends
   on the routing and a CUDA graph can hold the step.
2. gate_up launch: per (row block, column block) one expert's [BLOCK_M, D] x [D, BLOCK_N] for
   the gate columns and the same for the up columns, then silu(gate) * up in registers,
   stored in the assignment's row of h [T*k, I] (the activation fused: no [T*k, 2I] tensor).
3. down launch: h's rows x that expert's down [I, D], times the assignment's routing weight,
   into y [T*k, D]; the sum over a token's k rows is one torch reduction (deterministic,
   where summing in the kernel would need atomics).
Accumulation in fp32 (IEEE for fp32 inputs, not TF32); h and y in x's dtype, as vLLM rounds.
Blocks past num_padded exit at once. Same signature as `reference_moe.fused_experts`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference_moe import check_experts


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted_ids int32 [P], block_expert int32 [P / block_m], num_padded
    int32 [1]) (module doc). No host sync: every shape follows from T, k, E and block_m."""
    flat = topk_ids.reshape(-1).to(torch.int64)                                 # [N = T*k]
    n, dev = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m                        # [E]
    ends = padded.cumsum(0)                                                     # [E] end row of each expert
    order = torch.argsort(flat, stable=True)                                    # [N] assignments by expert
    e_sorted = flat[order]
    first = counts.cumsum(0) - counts                                           # [E] first sorted index
    dest = (ends - padded)[e_sorted] + torch.arange(n, device=dev) - first[e_sorted]     # [N] its row
    cap = triton.cdiv(n + min(num_experts, n) * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev).scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(0, cap, block_m, device=dev)                          # [P / block_m]
    block_expert = torch.searchsorted(ends, starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


@triton.jit
def _moe_gemm_kernel(a_ptr, b_ptr, c_ptr, w_ptr, sorted_ptr, expert_ptr, npad_ptr,
                     N, K, num_valid, top_k,
                     stride_am, stride_be, stride_bn, stride_cm,
                     GLU: tl.constexpr, WEIGHTED: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c[sorted row] = act(a[row // top_k] @ b[e]^T) (* w[row]); b[e] is [N (x 2 with GLU), K]."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ptr + offs_m).to(tl.int64)                           # [BM] assignment ids
    valid = rows < num_valid
    a_rows = rows // top_k                                                      # [BM] rows of a
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    b_base = b_ptr + e * stride_be
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :],
                    mask=valid[:, None] & k_mask[None, :], other=0.0)          # [BM, BK]
        bmask = k_mask[:, None] & n_mask[None, :]
        b = tl.load(b_base + offs_n[None, :] * stride_bn + offs_k[:, None], mask=bmask, other=0.0)  # [BK, BN]
        acc += tl.dot(a, b, input_precision=PRECISION)
        if GLU:   # the up rows follow the gate rows: row N + n
            bu = tl.load(b_base + (offs_n[None, :] + N) * stride_bn + offs_k[:, None], mask=bmask, other=0.0)
            acc_up += tl.dot(a, bu, input_precision=PRECISION)
    if GLU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(w_ptr + rows, mask=valid, other=0.0)[:, None]
    tl.store(c_ptr + rows[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=valid[:, None] & n_mask[None, :])


def _launch(a, b, c, w, align, n, k_dim, top_k, glu, weighted, block_m, block_n, block_k) -> None:
    sorted_ids, block_expert, num_padded = align
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _moe_gemm_kernel[grid](a, b, c, w, sorted_ids, block_expert, num_padded, n, k_dim, c.shape[0], top_k,
                           a.stride(0), b.stride(0), b.stride(1), c.stride(0),
                           GLU=glu, WEIGHTED=weighted,
                           PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)


def _block(n: int) -> int:
    """A tile size for a dimension of n: a power of two in [16, 64] (tl.dot needs >= 16)."""
    return max(16, min(64, triton.next_power_of_2(n)))


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, *, workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
                  block_m: int | None = None) -> torch.Tensor:
    """x [T, D] -> [T, D] in x's dtype (reference_moe.fused_experts's contract). workspace:
    (h [T*k, I], y [T*k, D]) buffers in x's dtype to use instead of fresh ones (a CUDA graph's
    static buffers; tests poison them)."""
    check_experts(x, w13, w2, topk_weights, topk_ids)
    t, k = topk_ids.shape
    e, two_i, d = w13.shape
    i = two_i // 2
    if workspace is None:
        workspace = (torch.empty(t * k, i, dtype=x.dtype, device=x.device),
                     torch.empty(t * k, d, dtype=x.dtype, device=x.device))
    h, y = workspace
    if (h.shape != (t * k, i) or y.shape != (t * k, d) or h.dtype != x.dtype or y.dtype != x.dtype
            or not (h.is_contiguous() and y.is_contiguous())):
        raise ValueError(f"workspace must be contiguous ({(t * k, i)}, {(t * k, d)}) in {x.dtype}, got "
                         f"({tuple(h.shape)} {h.dtype}, {tuple(y.shape)} {y.dtype})")
    if t == 0:
        return torch.zeros_like(x)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()           # [T*k]
    bm = block_m or (16 if t * k <= 256 else 64)
    align = moe_align_block_size(topk_ids, e, bm)
    _launch(x, w13, h, weights, align, i, d, k, True, False, bm, _block(i), _block(d))   # h = silu(x W1) * x W3
    _launch(h, w2, y, weights, align, d, i, 1, False, True, bm, _block(d), _block(i))    # y = w * h W2
    return y.view(t, k, d).sum(dim=1, dtype=torch.float32).to(x.dtype)         # [T, D]
