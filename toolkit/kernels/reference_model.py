"""Pure-torch twins of the model kernels (rms_norm.py, rotary.py with qk_norm_rotary, silu_and_mul.py).

Same signatures as the Triton launchers; the test oracle and the CPU path. They follow
Hugging Face Llama's order of operations and roundings, so in fp32 they equal it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from toolkit.kernels import reference


@dataclass(frozen=True)
class KVWrite:
    """Where rotary also stores this step's K/V (the rotated k, and v as given): the cache
    writer's arguments (`write_kv`), so one launch rotates and writes. An attention backend
    that takes such a write hands it out (AttentionBackend.kv_target, docs/interfaces.md)."""

    v: torch.Tensor                 # [T, H_kv, D]
    cache: torch.Tensor             # [2, num_blocks, block_size, H_kv, D] (fp8: e4m3 of x / scale)
    slots: torch.Tensor             # int [T]; -1: not stored
    k_scale: float = 1.0
    v_scale: float = 1.0


def check_kv_write(k: torch.Tensor, kv: KVWrite) -> None:
    """The argument checks of rotary's cache write (k: the rotated keys): write_kv's."""
    reference.check_write_kv_args(k, kv.v, kv.cache, kv.slots)
    reference.check_scales(kv.cache, kv.k_scale, kv.v_scale)


def _into(buf: torch.Tensor | None, value: torch.Tensor, name: str) -> torch.Tensor:
    if buf is None:
        return value
    if buf.shape != value.shape or buf.dtype != value.dtype or not buf.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous {tuple(value.shape)} {value.dtype}, "
            f"got {tuple(buf.shape)} {buf.dtype}"
        )
    return buf.copy_(value)


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    """The argument checks rms_norm and its Triton launcher share."""
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(
            f"weight must have shape ({n},) to match x [..., {n}], got {tuple(weight.shape)}"
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(
            f"residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}"
        )


def check_rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The argument checks rotary and its Triton launcher share; returns (q_out, k_out)."""
    t, d = positions.shape[0], cos_sin_cache.shape[-1]
    if d % 2 or cos_sin_cache.dim() != 2:
        raise ValueError(
            f"cos_sin_cache must be [P, D] with D even, got {tuple(cos_sin_cache.shape)}"
        )
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 3 or x.shape[0] != t or x.shape[2] != d:
            raise ValueError(f"{name} must be [T={t}, heads, D={d}], got {tuple(x.shape)}")
    q_out, k_out = (q, k) if out is None else out
    if (
        q_out.shape != q.shape
        or k_out.shape != k.shape
        or q_out.dtype != q.dtype
        or k_out.dtype != k.dtype
    ):
        raise ValueError(
            f"out must match q {tuple(q.shape)} and k {tuple(k.shape)} in shape and dtype, "
            f"got {tuple(q_out.shape)}, {tuple(k_out.shape)}"
        )
    return q_out, k_out


def check_qk_norm(q: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor) -> None:
    """The argument checks qk_norm_rotary and its Triton launcher share (after check_rotary)."""
    d = q.shape[-1]
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w.shape != (d,):
            raise ValueError(f"{name} must have shape ({d},) to match the head dim of q, got {tuple(w.shape)}")


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
    check_rms_norm(x, weight, residual)
    if residual is not None:
        x = _into(residual_out, x + residual, "residual_out")  # rounded to the activation dtype
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)  # [..., 1]
    normed = (weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)).to(x.dtype)
    return _into(out, normed, "out"), x


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv: KVWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int64 [T], q [T, H, D], k [T, H_kv, D], cos_sin_cache fp32 [P, D] -> (q, k) rotated.

    In place (the returned tensors are q and k) unless `out` = (q_out, k_out) is given; with
    `kv`, the rotated k and kv.v are also stored in kv.cache at kv.slots (`write_kv`).
    """
    q_out, k_out = check_rotary(positions, q, k, cos_sin_cache, out)
    if kv is not None:
        check_kv_write(k, kv)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)  # [T, heads, D/2]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    q_rot, k_rot = rot(q), rot(k)
    q_out, k_out = q_out.copy_(q_rot), k_out.copy_(k_rot)
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
    kv: KVWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over each head of q [T, H, D] and k [T, H_kv, D] (weights [D]), then `rotary`
    (Qwen3's order). In place unless `out` = (q_out, k_out) is given; `kv` as `rotary`'s."""
    q_out, k_out = check_rotary(positions, q, k, cos_sin_cache, out)
    check_qk_norm(q, q_weight, k_weight)
    q_normed, _ = rms_norm(q, q_weight, eps)
    k_normed, _ = rms_norm(k, k_weight, eps)
    return rotary(positions, q_normed, k_normed, cos_sin_cache, out=(q_out, k_out), kv=kv)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:]  [..., I] (into `out` if given)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {tuple(x.shape)}")
    gate, up = x.chunk(2, dim=-1)
    return _into(out, F.silu(gate) * up, "out")


def check_logits_out(out: torch.Tensor | None, n: int, v: int) -> None:
    """lm_head_logits' `out`: None, or a contiguous float32 [n, v]."""
    if out is not None and (out.dtype != torch.float32 or tuple(out.shape) != (n, v)
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous float32 [{n}, {v}], got {out.dtype} "
                         f"{tuple(out.shape)} (contiguous: {out.is_contiguous()})")


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor, *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [N, H], weight [V, H] -> float32 logits [N, V] (into `out` when given), rounded
    as Hugging Face does: the product in the inputs' dtype, then float32."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    check_logits_out(out, hidden.shape[0], weight.shape[0])
    logits = F.linear(hidden, weight).float()
    return logits if out is None else out.copy_(logits)
