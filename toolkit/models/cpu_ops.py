"""The model's elementwise ops on a CPU device: plain torch, in as few ops as the math allows.

On the CPU a decode step of a small model is bound by per-op dispatch (30 layers x tens of
ops), so these drop the twins' dtype round trips, chunks and concatenations while keeping
their order of operations and roundings in float32 (so greedy tokens equal Hugging Face's).
Other dtypes go to the twins in `toolkit.kernels.reference_model`, which round like HF
between steps. Same signatures as the twins and the Triton launchers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from toolkit.kernels import reference
from toolkit.kernels import reference_model as ref


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] (+ residual [..., N]), weight [N] -> (normed [..., N], new_residual [..., N])."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return ref.rms_norm(x, weight, eps, residual, out=out, residual_out=residual_out)
    ref.check_rms_norm(x, weight, residual)
    if residual is not None:
        x = x + residual if residual_out is None else torch.add(x, residual, out=residual_out)
    # one fused op; in float32 it rounds as weight * (x * rsqrt(mean(x^2) + eps)) does
    normed = F.rms_norm(x, (x.shape[-1],), weight, eps)
    if out is not None:
        out.copy_(normed)
        normed = out
    return normed, x


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv: ref.KVWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int64 [T], q [T, H, D], k [T, H_kv, D], cos_sin_cache fp32 [P, D] -> (q, k)
    rotated (neox halves); in place unless `out` = (q_out, k_out); with `kv`, the rotated k
    and kv.v also stored in the cache (the twins' `KVWrite`)."""
    if q.dtype != torch.float32 or k.dtype != torch.float32:
        return ref.rotary(positions, q, k, cos_sin_cache, out=out, kv=kv)
    q_out, k_out = ref.check_rotary(positions, q, k, cos_sin_cache, out)
    if kv is not None:
        ref.check_kv_write(k, kv)
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions)[:, None, :]      # [T, 1, D]: cos | sin
    cos, sin = cs[..., :half], cs[..., half:]                      # [T, 1, D/2] each
    for x, o in ((q, q_out), (k, k_out)):
        x1, x2 = x[..., :half], x[..., half:]                      # [T, heads, D/2] views
        s1, s2 = x1 * sin, x2 * sin                                # before o (maybe x) is written
        o1, o2 = o[..., :half], o[..., half:]
        torch.mul(x1, cos, out=o1).sub_(s2)                        # x1 cos - x2 sin
        torch.mul(x2, cos, out=o2).add_(s1)                        # x2 cos + x1 sin
    if kv is not None:
        reference.write_kv(k_out, kv.v, kv.cache, kv.slots, kv.k_scale, kv.v_scale)
    return q_out, k_out


def qk_norm_rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv: ref.KVWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over each head of q [T, H, D] and k [T, H_kv, D], then `rotary` (its `kv` too);
    in place unless `out`."""
    out = ref.check_rotary(positions, q, k, cos_sin_cache, out)
    ref.check_qk_norm(q, q_weight, k_weight)
    q_normed, _ = rms_norm(q, q_weight, eps)
    k_normed, _ = rms_norm(k, k_weight, eps)
    return rotary(positions, q_normed, k_normed, cos_sin_cache, out=out, kv=kv)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  [..., I] (into `out` if given)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {tuple(x.shape)}")
    i = x.shape[-1] // 2
    gate = F.silu(x[..., :i])                                      # [..., I]
    if out is None:
        return gate.mul_(x[..., i:])
    if out.shape != gate.shape or out.dtype != gate.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(gate.shape)} {gate.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    return torch.mul(gate, x[..., i:], out=out)
