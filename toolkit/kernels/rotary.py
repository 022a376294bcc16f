"""Rotary position embedding (neox style, as Llama uses) on q and k (Triton).

The cache holds cos | sin of each position: cos_sin_cache [P, D] fp32, where row p is
cos(p * inv_freq) [D/2] followed by sin(p * inv_freq) [D/2]. Neox style rotates the two
halves of a head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
One program per (token, head); q and k are two launches of the same kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference_model import check_rotary


@triton.jit
def _rotary_kernel(
    x_ptr,
    out_ptr,
    pos_ptr,
    cache_ptr,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    stride_cache,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=mask, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs, mask=mask, other=0.0)
    x = x_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    o = out_ptr + t * stride_ot + h * stride_oh
    ty = out_ptr.dtype.element_ty
    tl.store(o + offs, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(o + HALF + offs, (x2 * cos + x1 * sin).to(ty), mask=mask)


def _check(name: str, x: torch.Tensor, t: int, d: int) -> None:
    if x.dim() != 3 or x.shape[0] != t or x.shape[2] != d:
        raise ValueError(f"{name} must be [T={t}, heads, D={d}], got {tuple(x.shape)}")
    if x.stride(2) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {x.stride()}"
        )


def _launch(
    x: torch.Tensor, out: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor
) -> None:
    t, h, d = x.shape
    if t == 0 or h == 0:
        return
    _rotary_kernel[(t, h)](
        x,
        out,
        positions,
        cache,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        cache.stride(0),
        HALF=d // 2,
        BLOCK=triton.next_power_of_2(d // 2),
    )


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int64 [T], q [T, H, D], k [T, H_kv, D], cos_sin_cache fp32 [P, D] -> (q, k) rotated.

    In place (the returned tensors are q and k) unless `out` = (q_out, k_out) is given.
    """
    q_out, k_out = check_rotary(positions, q, k, cos_sin_cache, out)
    t, d = positions.shape[0], cos_sin_cache.shape[1]
    _check("q", q, t, d)       # the kernel also needs a contiguous last dimension
    _check("k", k, t, d)
    if cos_sin_cache.stride(1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    _check("q_out", q_out, t, d)
    _check("k_out", k_out, t, d)
    _launch(q, q_out, positions, cos_sin_cache)
    _launch(k, k_out, positions, cos_sin_cache)
    return q_out, k_out
