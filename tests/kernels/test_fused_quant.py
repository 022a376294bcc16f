"""Fused activation quantization (toolkit/kernels/fused_quant.py) against its twins.

Under TRITON_INTERPRET=1 in fp32 / fp16 on hypothesis shapes (odd hidden sizes, zero rows,
no rows, extreme values): int8 codes within one step of the twin's (a tie x / s = j + 0.5 may
round apart after a last-bit difference of the dense value), scales and the new residual
close, nothing NaN. The interpreter's fp8 cast does not carry a rounding into the exponent
(126.8 -> 64), so fp8 codes are compared on the GPU only (`gpu` tests, bf16, real shapes);
under the interpreter fp8's scales and residual are.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import reference_quant as ref
from toolkit.kernels.fused_quant import rms_norm_dynamic_per_token_quant, silu_and_mul_per_token_quant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE_TOL = {torch.float32: dict(rtol=1e-5, atol=0), torch.float16: dict(rtol=2e-3, atol=0),
             torch.bfloat16: dict(rtol=1e-2, atol=0)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(t: int, k: int, seed: int, zero_row: bool, big: bool) -> torch.Tensor:
    x = torch.randn(t, k, generator=gen(seed)) * (300.0 if big else 1.0)   # 300: fp16-safe squares
    if zero_row and t:
        x[0] = 0.0
    return x


def _codes_match(q: torch.Tensor, q_ref: torch.Tensor, dtype: torch.dtype, int8_steps: int = 1) -> None:
    assert q.dtype == dtype and q.shape == q_ref.shape
    if dtype == torch.int8 or q.is_cuda:
        step = int8_steps if dtype == torch.int8 else 32     # fp8: one e4m3 step at 448
        assert (q.float() - q_ref.float()).abs().max().item() <= step if q.numel() else True


@given(t=st.integers(0, 7), n=st.integers(1, 257), residual=st.booleans(), zero_row=st.booleans(),
       big=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float16]),
       qdtype=st.sampled_from([torch.int8, ref.FP8]), seed=st.integers(0, 2**16))
def test_rms_norm_quant_matches_twin(t, n, residual, zero_row, big, dtype, qdtype, seed):
    x = _rows(t, n, seed, zero_row, big).to(DEVICE, dtype)
    r = _rows(t, n, seed + 1, False, False).to(DEVICE, dtype) if residual else None
    if r is not None and zero_row and t:
        r[0] = 0.0
    w = (torch.rand(n, generator=gen(seed + 2)) + 0.5).to(DEVICE, dtype)
    q, s, res = rms_norm_dynamic_per_token_quant(x, w, 1e-6, qdtype, r)
    q_ref, s_ref, res_ref = ref.rms_norm_dynamic_per_token_quant(x, w, 1e-6, qdtype, r)
    assert s.shape == (t, 1) and s.dtype == torch.float32 and not s.isnan().any()
    torch.testing.assert_close(s, s_ref, **SCALE_TOL[dtype])
    torch.testing.assert_close(res, res_ref, rtol=0, atol=0)          # the same rounded sum
    _codes_match(q, q_ref, qdtype)
    if zero_row and t:
        assert (q[0].float() == 0).all() and s[0].item() == pytest.approx(ref.MIN_SCALE)


@given(t=st.integers(0, 7), i=st.integers(1, 300), zero_row=st.booleans(), big=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float16]), qdtype=st.sampled_from([torch.int8, ref.FP8]),
       seed=st.integers(0, 2**16))
def test_silu_and_mul_quant_matches_twin(t, i, zero_row, big, dtype, qdtype, seed):
    x = (_rows(t, 2 * i, seed, zero_row, False) * (15.0 if big else 1.0)).to(DEVICE, dtype)   # |silu*up| < fp16 max
    q, s = silu_and_mul_per_token_quant(x, qdtype)
    q_ref, s_ref = ref.silu_and_mul_per_token_quant(x, qdtype)
    assert s.shape == (t, 1) and not s.isnan().any()
    # fp16: the twin rounds silu(gate) before the product, the kernel once after it
    torch.testing.assert_close(s, s_ref, **SCALE_TOL[dtype])
    _codes_match(q, q_ref, qdtype)
    if zero_row and t:
        assert (q[0].float() == 0).all()


@pytest.mark.parametrize("i", [4096, 4100])
def test_silu_and_mul_quant_wide_rows(i):
    """The widest row held in registers, and the two-pass path past it (an odd remainder)."""
    x = (torch.randn(3, 2 * i, generator=gen(i)) * 4).to(DEVICE)
    x[1] = 0.0
    q, s = silu_and_mul_per_token_quant(x, torch.int8)
    q_ref, s_ref = ref.silu_and_mul_per_token_quant(x, torch.int8)
    torch.testing.assert_close(s, s_ref, **SCALE_TOL[torch.float32])
    _codes_match(q, q_ref, torch.int8)
    assert (q[1] == 0).all()


def test_int8_codes_dequantize_to_the_norm():
    """Not only the twin: the codes times the scales are the plain RMSNorm within half a step."""
    x = torch.randn(5, 67, generator=gen(0)).to(DEVICE)
    w = torch.rand(67, generator=gen(1)).to(DEVICE) + 0.5
    q, s, _ = rms_norm_dynamic_per_token_quant(x, w, 1e-5, torch.int8)
    want = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert ((q.float() * s - want).abs() <= s * 0.5 + 1e-6).all()


def test_refuses_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_per_token_quant(torch.zeros(2, 5, device=DEVICE), torch.int8)
    with pytest.raises(ValueError, match="float8_e4m3fn or torch.int8"):
        silu_and_mul_per_token_quant(torch.zeros(2, 4, device=DEVICE), torch.float16)
    with pytest.raises(ValueError):
        rms_norm_dynamic_per_token_quant(torch.zeros(2, 4, device=DEVICE), torch.ones(3, device=DEVICE),
                                         1e-6, torch.int8)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 333])
@pytest.mark.parametrize("qdtype", [ref.FP8, torch.int8])
def test_gpu_bf16_real_shapes(t, qdtype):
    g = gen(t)
    x = torch.randn(t, 4096, generator=g).cuda().bfloat16()
    r = torch.randn(t, 4096, generator=g).cuda().bfloat16()
    w = (torch.rand(4096, generator=g) + 0.5).cuda().bfloat16()
    q, s, res = rms_norm_dynamic_per_token_quant(x, w, 1e-5, qdtype, r)
    q_ref, s_ref, res_ref = ref.rms_norm_dynamic_per_token_quant(x, w, 1e-5, qdtype, r)
    torch.testing.assert_close(s, s_ref, **SCALE_TOL[torch.bfloat16])
    torch.testing.assert_close(res, res_ref, rtol=0, atol=0)
    _codes_match(q, q_ref, qdtype)
    gu = torch.randn(t, 2 * 14336, generator=g).cuda().bfloat16()
    q, s = silu_and_mul_per_token_quant(gu, qdtype)
    q_ref, s_ref = ref.silu_and_mul_per_token_quant(gu, qdtype)
    torch.testing.assert_close(s, s_ref, **SCALE_TOL[torch.bfloat16])
    # bf16: the twin rounds silu(gate) to bf16 before the product (two roundings), the kernel
    # once, so a dense value may differ by a bf16 ulp (up to 2^-7 of it): one int8 step at
    # 127, plus the code's own rounding (seen once at t=333 on the H200)
    _codes_match(q, q_ref, qdtype, int8_steps=2)
