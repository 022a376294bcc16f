"""Quantized-linear kernels against their torch twins (toolkit/kernels/reference_quant.py).

On the CPU the Triton kernels run under TRITON_INTERPRET=1 at small odd shapes in fp32/fp16:
the W4A16 / grouped-W8 GEMM (odd K and N, K not a multiple of the group or of 8, zero and
extreme scales, with and without zero points) and the per-token activation quantization in
int8. The interpreter's fp8 cast does not carry a rounding into the exponent (126.8 -> 64), so
fp8 codes are compared on the GPU only; under the interpreter the fp8 scales are. `gpu` tests
repeat everything at real shapes in bf16 and check the cuBLASLt fp8 and int8 GEMMs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import reference_quant as ref
from toolkit.kernels.quant_act import per_token_quant
from toolkit.kernels.quant_w4a16 import grouped_w8a16_gemm, w4a16_gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=6e-2, rtol=2e-2)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not actual.isnan().any(), "NaN in the kernel's output"
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


def _scales(n: int, groups: int, kind: str, g: torch.Generator) -> torch.Tensor:
    s = torch.rand(n, groups, generator=g) * 0.1 + 0.01
    if kind == "zero":                     # a zeroed group: its weights are 0, never NaN
        s[:, :: 2] = 0.0
    elif kind == "extreme":                # large and tiny scales side by side
        s[:, ::2] *= 1e3
        s[:, 1::2] *= 1e-4
    return s


# ---------------------------------------------------------------- packing
@given(n=st.integers(1, 9), k=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_pack_unpack_roundtrip(n, k, seed):
    u = torch.randint(0, 16, (n, k), generator=gen(seed)).to(torch.uint8)
    packed = ref.pack_int4(u)
    assert packed.shape == (n, -(-k // 8)) and packed.dtype == torch.int32
    assert torch.equal(ref.unpack_int4(packed, k), u)


# ---------------------------------------------------------------- W4A16 and grouped W8
@given(m=st.integers(1, 20), n=st.integers(1, 70), k=st.integers(1, 90), group=st.sampled_from([8, 16, 24, 128]),
       zeros=st.booleans(), bias=st.booleans(), scales=st.sampled_from(["normal", "zero", "extreme"]),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_w4a16_gemm_matches_twin(m, n, k, group, zeros, bias, scales, dtype, seed):
    g = gen(seed)
    groups = -(-k // group)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    qw = ref.pack_int4(torch.randint(0, 16, (n, k), generator=g)).to(DEVICE)
    s = _scales(n, groups, scales, g)
    if dtype == torch.float16:
        s = s.clamp(max=10.0)              # fp16 outputs stay finite
    s = s.to(DEVICE)
    z = torch.randint(0, 16, (n, groups), generator=g).to(torch.uint8).to(DEVICE) if zeros else None
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    got = w4a16_gemm(x, qw, s, z, group, b)
    want = ref.w4a16_gemm(x, qw, s, z, group, b)
    assert got.shape == (m, n) and got.dtype == dtype
    scale = want.float().abs().max().clamp(min=1.0)
    close(got / scale, want / scale, dtype)


@pytest.mark.parametrize("m", [1, 40])
@pytest.mark.parametrize("zeros", [False, True])
def test_w4a16_gemm_group_128_over_several_k_tiles(m, zeros):
    """The checkpoints' layout (group 128: one scale per row a tile) over five K tiles, the
    last partial, split across programs at M=1 and in 64-row tiles at M=40; K=0 is an
    empty sum (the bias alone)."""
    g = gen(m)
    k, n, group = 520, 70, 128
    x = torch.randn(m, k, generator=g).to(DEVICE)
    qw = ref.pack_int4(torch.randint(0, 16, (n, k), generator=g)).to(DEVICE)
    s = _scales(n, -(-k // group), "normal", g).to(DEVICE)
    z = torch.randint(0, 16, (n, -(-k // group)), generator=g).to(torch.uint8).to(DEVICE) if zeros else None
    got = w4a16_gemm(x, qw, s, z, group)
    close(got, ref.w4a16_gemm(x, qw, s, z, group), torch.float32)
    b = torch.randn(n, generator=g).to(DEVICE)
    empty = w4a16_gemm(x[:, :0], qw[:, :0], s[:, :0], None if z is None else z[:, :0], group, b)
    close(empty, b.expand(m, n), torch.float32)


@given(m=st.integers(1, 20), n=st.integers(1, 50), k=st.integers(1, 70), group=st.sampled_from([16, 32, 7]),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_grouped_w8a16_gemm_matches_twin(m, n, k, group, dtype, seed):
    g = gen(seed)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(ref.FP8).to(DEVICE)
    s = (torch.rand(n, -(-k // group), generator=g) * 1e-2).to(DEVICE)
    got = grouped_w8a16_gemm(x, w, s, group)
    want = ref.grouped_w8a16_gemm(x, w, s, group)
    scale = want.float().abs().max().clamp(min=1.0)
    close(got / scale, want / scale, dtype)


def test_w4a16_gemm_refuses_bad_shapes():
    x = torch.randn(3, 20, device=DEVICE)
    with pytest.raises(ValueError, match="qweight must be int32"):
        w4a16_gemm(x, torch.zeros(5, 2, dtype=torch.int32, device=DEVICE), torch.ones(5, 2, device=DEVICE), None, 16)
    with pytest.raises(ValueError, match="scales must be"):
        w4a16_gemm(x, torch.zeros(5, 3, dtype=torch.int32, device=DEVICE), torch.ones(5, 3, device=DEVICE), None, 16)


# ---------------------------------------------------------------- activation quantization
@given(t=st.integers(1, 9), k=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.float16]),
       zero_row=st.booleans(), big=st.booleans(), seed=st.integers(0, 2**16))
def test_per_token_quant_int8_matches_twin(t, k, dtype, zero_row, big, seed):
    x = torch.randn(t, k, generator=gen(seed)) * (1e3 if big else 1.0)
    if zero_row:
        x[0] = 0.0
    x = x.to(DEVICE, dtype)
    q, s = per_token_quant(x, torch.int8)
    q_ref, s_ref = ref.per_token_quant(x, torch.int8)
    assert q.dtype == torch.int8 and s.shape == (t, 1) and not s.isnan().any()
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert (q.int() - q_ref.int()).abs().max() <= 1          # a tie x / s = j + 0.5 may round apart
    if zero_row:
        assert (q[0] == 0).all()


@given(t=st.integers(1, 6), k=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_per_token_quant_fp8_scales_match_twin(t, k, seed):
    x = torch.randn(t, k, generator=gen(seed)).to(DEVICE)
    _, s = per_token_quant(x, ref.FP8)
    _, s_ref = ref.per_token_quant(x, ref.FP8)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)


def test_twin_scaled_mm_is_the_dequantized_product():
    g = gen(0)
    a, w = torch.randn(5, 33, generator=g), torch.randn(7, 33, generator=g)
    qa, sa = ref.per_token_quant(a, torch.int8)
    qw, sw = ref.per_token_quant(w, torch.int8)
    got = ref.scaled_mm(qa, sa, qw, sw.reshape(-1), None, torch.float32)
    torch.testing.assert_close(got, (qa.float() * sa) @ (qw.float() * sw).t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, a @ w.t(), rtol=0.05, atol=0.1)   # and close to the float product


def test_skinny_scaled_mm_of_no_columns_is_the_bias():
    from toolkit.kernels.quant_w8a8_skinny import scaled_mm_skinny

    a, w = torch.zeros(3, 0, dtype=torch.int8, device=DEVICE), torch.zeros(5, 0, dtype=torch.int8, device=DEVICE)
    b = torch.arange(5.0, device=DEVICE)
    got = scaled_mm_skinny(a, torch.ones(3, 1, device=DEVICE), w, torch.ones(5, device=DEVICE), b, torch.float32)
    assert torch.equal(got, b.expand(3, 5))


@given(m=st.integers(1, 20), n=st.integers(1, 70), k=st.integers(1, 300), bias=st.booleans(),
       dtype=st.sampled_from([torch.int8, ref.FP8]), seed=st.integers(0, 2**16))
def test_skinny_scaled_mm_matches_twin(m, n, k, bias, dtype, seed):
    from toolkit.kernels.quant_w8a8_skinny import scaled_mm_skinny

    g = gen(seed)
    qa, sa = ref.per_token_quant(torch.randn(m, k, generator=g), dtype)
    qw, sw = ref.per_token_quant(torch.randn(n, k, generator=g), dtype)
    b = torch.randn(n, generator=g).to(DEVICE) if bias else None
    qa, sa, qw, sw = qa.to(DEVICE), sa.to(DEVICE), qw.to(DEVICE), sw.reshape(-1).to(DEVICE)
    got = scaled_mm_skinny(qa, sa, qw, sw, b, torch.float32)
    want = ref.scaled_mm(qa, sa, qw, sw, b, torch.float32)
    assert got.shape == (m, n) and not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


# ---------------------------------------------------------------- GPU: bf16, fp8, real shapes
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 17, 128, 1000])
@pytest.mark.parametrize("dtype", [ref.FP8, torch.int8])
def test_gpu_scaled_mm_matches_twin(m, dtype):
    from toolkit.kernels.quant_w8a8 import scaled_mm

    g = gen(m)
    a = torch.randn(m, 4096, generator=g).cuda().bfloat16()
    w = torch.randn(1024, 4096, generator=g).cuda().bfloat16()
    qa, sa = per_token_quant(a, dtype)
    qa_ref, sa_ref = ref.per_token_quant(a, dtype)
    torch.testing.assert_close(sa, sa_ref)
    assert (qa.float() - qa_ref.float()).abs().max() <= (1 if dtype == torch.int8 else 32)
    qw, sw = ref.per_token_quant(w, dtype)
    bias = torch.randn(1024, generator=g).cuda().bfloat16()
    got = scaled_mm(qa, sa, qw, sw.reshape(-1), bias, torch.bfloat16)
    want = ref.scaled_mm(qa, sa, qw, sw.reshape(-1), bias, torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("dtype", [ref.FP8, torch.int8])
def test_gpu_skinny_scaled_mm_matches_twin(m, dtype):
    from toolkit.kernels.quant_w8a8_skinny import scaled_mm_skinny

    g = gen(m + 7)
    qa, sa = ref.per_token_quant(torch.randn(m, 4096, generator=g).cuda().bfloat16(), dtype)
    qw, sw = ref.per_token_quant(torch.randn(6144, 4096, generator=g).cuda().bfloat16(), dtype)
    got = scaled_mm_skinny(qa, sa, qw, sw.reshape(-1), None, torch.bfloat16)
    want = ref.scaled_mm(qa, sa, qw, sw.reshape(-1), None, torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64, 512])
def test_gpu_w4a16_bf16_at_llama_shapes(m):
    g = gen(m)
    n, k, group = 4096, 4096, 128
    x = torch.randn(m, k, generator=g).cuda().bfloat16()
    qw = ref.pack_int4(torch.randint(0, 16, (n, k), generator=g)).cuda()
    s = (torch.rand(n, k // group, generator=g) * 1e-2).cuda()
    z = torch.randint(0, 16, (n, k // group), generator=g).to(torch.uint8).cuda()
    got = w4a16_gemm(x, qw, s, z, group)
    want = ref.w4a16_gemm(x, qw, s, z, group)
    scale = want.float().abs().max()
    close(got / scale, want / scale, torch.bfloat16)
