"""Rotary position embedding (neox style, as Llama uses) on q and k in one launch (Triton),
optionally after Qwen3's RMSNorm over each head (`qk_norm_rotary`).

The cache holds cos | sin of each position: cos_sin_cache [P, D] fp32, where row p is
cos(p * inv_freq) [D/2] followed by sin(p * inv_freq) [D/2]. Neox style rotates the two
halves of a head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).

One program per (token, block of heads), the heads counted over q's then k's, so q and k
(and their norms) are one launch, not two (rotary) or four (norms + rotary): in a decode
step these kernels are a few microseconds each, mostly launch latency. With a `KVWrite` the
same launch also stores the rotated k and the raw v in the paged cache (the cache writer's
work, `write_kv.py`, with its fp8 encoding): one launch a layer fewer. The norm rounds to
the activation dtype where the unfused rms_norm kernel stores its output, so the fused
kernel gives the unfused pair's values. Twins: `reference_model.rotary`, `.qk_norm_rotary`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference import FP8_DTYPE
from toolkit.kernels.reference_model import KVWrite, check_kv_write, check_qk_norm, check_rotary
from toolkit.kernels.write_kv import _e4m3_bits


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, cache_ptr, q_w_ptr, k_w_ptr,
    v_ptr, kvc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cache,
    stride_vt, stride_vh, stride_c0, stride_cb, stride_cs, stride_ch,
    num_q_heads, num_rot_heads, num_heads, block_size, eps, k_scale, v_scale,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr,
    KV: tl.constexpr, FP8: tl.constexpr,
):
    # heads of a token: q's [0, Hq), k's [Hq, Hq + Hkv) = num_rot_heads, and with KV v's up to
    # num_heads (v is not rotated, only stored in the cache)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)           # [BH]
    offs = tl.arange(0, BLOCK)                                        # [B] within a half
    is_q = h < num_q_heads
    is_k = (h >= num_q_heads) & (h < num_rot_heads)
    is_v = (h >= num_rot_heads) & (h < num_heads)
    hq = tl.where(is_q, h, 0).to(tl.int64)[:, None]                   # [BH, 1]
    hk = tl.where(is_k, h - num_q_heads, 0).to(tl.int64)[:, None]
    hv = tl.where(is_v, h - num_rot_heads, 0).to(tl.int64)[:, None]
    in_half = (offs < HALF)[None, :]                                  # [1, B]
    mq, mk, mv = is_q[:, None] & in_half, is_k[:, None] & in_half, is_v[:, None] & in_half   # [BH, B]
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=offs < HALF, other=0.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs, mask=offs < HALF, other=0.0)[None, :]
    q = q_ptr + t * stride_qt + hq * stride_qh + offs[None, :]
    k = k_ptr + t * stride_kt + hk * stride_kh + offs[None, :]
    x1 = tl.where(mq, tl.load(q, mask=mq, other=0.0), tl.load(k, mask=mk, other=0.0)).to(tl.float32)
    x2 = tl.where(mq, tl.load(q + HALF, mask=mq, other=0.0),
                  tl.load(k + HALF, mask=mk, other=0.0)).to(tl.float32)
    ty = q_out_ptr.dtype.element_ty
    if NORM:    # RMSNorm over the head [D], rounded as the rms_norm kernel rounds
        var = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)   # [BH]
        rstd = (1.0 / tl.sqrt(var + eps))[:, None]
        m = offs < HALF
        w1 = tl.where(is_q[:, None], tl.load(q_w_ptr + offs, mask=m, other=0.0)[None, :],
                      tl.load(k_w_ptr + offs, mask=m, other=0.0)[None, :]).to(tl.float32)
        w2 = tl.where(is_q[:, None], tl.load(q_w_ptr + HALF + offs, mask=m, other=0.0)[None, :],
                      tl.load(k_w_ptr + HALF + offs, mask=m, other=0.0)[None, :]).to(tl.float32)
        x1 = (w1 * (x1 * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
        x2 = (w2 * (x2 * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
    o1 = (x1 * cos - x2 * sin).to(ty)
    o2 = (x2 * cos + x1 * sin).to(ty)
    qo = q_out_ptr + t * stride_qot + hq * stride_qoh + offs[None, :]
    ko = k_out_ptr + t * stride_kot + hk * stride_koh + offs[None, :]
    tl.store(qo, o1, mask=mq)
    tl.store(qo + HALF, o2, mask=mq)
    tl.store(ko, o1, mask=mk)
    tl.store(ko + HALF, o2, mask=mk)
    if KV:      # the rotated k and the raw v into the cache slot (write_kv's layout and rounding)
        vp = v_ptr + t * stride_vt + hv * stride_vh + offs[None, :]
        v1 = tl.load(vp, mask=mv, other=0.0)
        v2 = tl.load(vp + HALF, mask=mv, other=0.0)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        keep = slot >= 0                                              # slot -1: not stored
        blk = tl.where(keep, slot, 0) // block_size
        off = tl.where(keep, slot, 0) % block_size
        h_kv = tl.where(is_v[:, None], hv, hk)                        # [BH, 1]
        dst = (kvc_ptr + blk * stride_cb + off * stride_cs + tl.where(is_v[:, None], stride_c0, 0)
               + h_kv * stride_ch + offs[None, :])
        c1 = tl.where(mv, v1.to(ty), o1)                              # [BH, B] in the activation dtype
        c2 = tl.where(mv, v2.to(ty), o2)
        mc = (mk | mv) & ((offs[None, :] * 0 + slot) >= 0)          # (a [BH, B] mask: the interpreter
                                                                      # cannot store under a broadcast scalar)
        if FP8:     # kvc_ptr is the cache's bytes: e4m3(x / scale), as write_kv stores it
            sc = tl.where(is_v[:, None], v_scale, k_scale)
            c1 = _e4m3_bits(tl.div_rn(c1.to(tl.float32), sc))
            c2 = _e4m3_bits(tl.div_rn(c2.to(tl.float32), sc))
        tl.store(dst, c1.to(kvc_ptr.dtype.element_ty), mask=mc)
        tl.store(dst + HALF, c2.to(kvc_ptr.dtype.element_ty), mask=mc)


def _check(name: str, x: torch.Tensor, t: int, d: int) -> None:
    if x.dim() != 3 or x.shape[0] != t or x.shape[2] != d:
        raise ValueError(f"{name} must be [T={t}, heads, D={d}], got {tuple(x.shape)}")
    if x.stride(2) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {x.stride()}"
        )


def _launch(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor,
            out: tuple[torch.Tensor, torch.Tensor], norm: tuple[torch.Tensor, torch.Tensor, float] | None,
            kv: KVWrite | None) -> tuple[torch.Tensor, torch.Tensor]:
    q_out, k_out = out
    t, d = positions.shape[0], cache.shape[1]
    for name, x in (("q", q), ("k", k), ("q_out", q_out), ("k_out", k_out)):
        _check(name, x, t, d)       # the kernel also needs a contiguous last dimension
    if kv is not None:
        check_kv_write(k, kv)
        _check("kv.v", kv.v, t, d)
        if kv.cache.stride(-1) != 1:
            raise ValueError(f"kv.cache must be contiguous in its last dimension, got strides {kv.cache.stride()}")
    if cache.stride(1) != 1:
        cache = cache.contiguous()
    rot_heads = q.shape[1] + k.shape[1]
    heads = rot_heads + (k.shape[1] if kv is not None else 0)
    if t == 0 or heads == 0:
        return q_out, k_out
    block = triton.next_power_of_2(d // 2)
    block_h = min(triton.next_power_of_2(heads), max(1, 2048 // block))   # <= 4096 elements a program
    q_w, k_w, eps = norm if norm is not None else (cache, cache, 0.0)     # unread without NORM
    fp8 = kv is not None and kv.cache.dtype == FP8_DTYPE
    if kv is None:                  # unread without KV
        v, kvc, slots, scales = q, q_out, positions, (1.0, 1.0)
    else:
        v, slots, scales = kv.v, kv.slots, (kv.k_scale, kv.v_scale)
        kvc = kv.cache.view(torch.uint8) if fp8 else kv.cache
    _rotary_kernel[(t, triton.cdiv(heads, block_h))](
        q, k, q_out, k_out, positions, cache, q_w, k_w, v, kvc, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cache.stride(0),
        v.stride(0), v.stride(1), *(kvc.stride()[:4] if kv is not None else (0, 0, 0, 0)),
        q.shape[1], rot_heads, heads, kvc.shape[2] if kv is not None else 1, float(eps),
        float(scales[0]), float(scales[1]),
        HALF=d // 2, BLOCK_H=block_h, BLOCK=block, NORM=norm is not None, KV=kv is not None, FP8=fp8,
    )
    return q_out, k_out


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
    `kv`, the same launch stores the rotated k and kv.v in kv.cache at kv.slots (`write_kv`).
    """
    out = check_rotary(positions, q, k, cos_sin_cache, out)
    return _launch(positions, q, k, cos_sin_cache, out, None, kv)


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
    """RMSNorm over each head of q [T, H, D] (weight q_weight [D]) and k [T, H_kv, D] (k_weight),
    then rotary as `rotary` (with its `kv` cache write): Qwen3's attention input, in one launch.
    In place unless `out`."""
    out = check_rotary(positions, q, k, cos_sin_cache, out)
    check_qk_norm(q, q_weight, k_weight)
    return _launch(positions, q, k, cos_sin_cache, out, (q_weight, k_weight, eps), kv)
