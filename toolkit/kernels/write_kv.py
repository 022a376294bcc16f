"""write_kv: store this step's K/V [T, H_kv, D] at their cache slots (slot -1 = skip).

One program per (token, block of heads), vectorised over D. Any head_dim works: D is
padded to a power of two and masked (80, 96, 97 ...). Twin: toolkit.kernels.reference.write_kv.

An fp8 cache (float8_e4m3fn) stores e4m3(x / scale), saturated to +-448. The kernel encodes
the e4m3 bits itself with integer arithmetic (round to nearest even, NaN kept) and stores
bytes: bit-identical to torch's cast on every input, on the GPU and under Triton's CPU
interpreter alike (the interpreter's own fp32->fp8 cast neither carries a rounding into the
exponent nor keeps NaN). The cost is a dozen integer ops an element in a memory-bound kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.kernels.reference import FP8_DTYPE, check_scales, check_write_kv_args


@triton.jit
def _e4m3_bits(x):
    """float32 [...] -> e4m3fn bit patterns (uint32 [...], < 256): saturating, RNE, NaN -> 0x7F."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) << 7
    a = bits & 0x7FFFFFFF                                              # |x| as bits
    # |x| >= 2^-6 (e4m3 normal): round the 23-bit mantissa to 3 bits, nearest even; a carry
    # moves into the exponent; then rebias 127 -> 7 (960 = (127 - 7) << 3)
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
    # |x| < 2^-6 (subnormal, steps of 2^-9): 2^14 + |x| in float32 rounds |x| to a multiple of
    # 2^-9 (the ulp at 2^14), nearest even, in one rounding; its low mantissa bits count the steps
    sub = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - 0x46800000
    code = tl.where(a >= 0x3C800000, normal, sub)
    code = tl.where(a >= 0x43E00000, 0x7E, code)                      # >= 448 (and inf): saturate
    code = tl.where(a > 0x7F800000, 0x7F, code)                       # NaN
    return code | sign


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_c0, stride_cb, stride_cs, stride_ch, stride_cd,
    num_heads, head_dim, block_size, k_scale, v_scale,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)          # [BLOCK_H]
    d = tl.arange(0, BLOCK_D)                                       # [BLOCK_D]
    slot = tl.load(slot_ptr + t).to(tl.int64)
    # slot -1 is skipped through the mask (no heads to write), not by an early return
    heads = tl.where(slot >= 0, num_heads, 0)
    mask = (h[:, None] < heads) & (d[None, :] < head_dim)
    blk = slot // block_size
    off = slot % block_size
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd, mask=mask)
    dst = cache_ptr + blk * stride_cb + off * stride_cs + h[:, None] * stride_ch + d[None, :] * stride_cd
    if FP8:     # cache_ptr is the cache's bytes (uint8)
        k = _e4m3_bits(tl.div_rn(k.to(tl.float32), k_scale))
        v = _e4m3_bits(tl.div_rn(v.to(tl.float32), v_scale))
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_c0, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v: [T, H_kv, D]; kv_cache: [2, NB, BS, H_kv, D]; slot_mapping: int [T] (distinct slots,
    -1 = skip); k_scale, v_scale: the dequantisation scales of an fp8 cache (1.0 otherwise)."""
    check_write_kv_args(k, v, kv_cache, slot_mapping)
    check_scales(kv_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    fp8 = kv_cache.dtype == FP8_DTYPE
    cache = kv_cache.view(torch.uint8) if fp8 else kv_cache
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_heads), max(1, 2048 // block_d))   # <= 2048 elements a program
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _write_kv_kernel[grid](
        k, v, cache, slot_mapping,
        *k.stride(), *v.stride(), *cache.stride(),
        num_heads, head_dim, cache.shape[2], float(k_scale), float(v_scale),
        BLOCK_H=block_h, BLOCK_D=block_d, FP8=fp8,
    )
