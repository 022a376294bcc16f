"""Model kernels (RMSNorm + residual, rotary, per-head RMSNorm + rotary, SiLU-and-mul) against
their torch twins.

On the CPU they run under TRITON_INTERPRET=1 (set by tests/conftest.py) at small odd
shapes in fp32/fp16; outputs are poisoned with NaN first so an element the kernel forgets
to write fails, and NaN never compares equal. `gpu` tests repeat them at real shapes in bf16.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import reference_model as ref
from toolkit.kernels.rms_norm import rms_norm
from toolkit.kernels.rotary import qk_norm_rotary, rotary
from toolkit.kernels.silu_and_mul import silu_and_mul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = st.sampled_from([torch.float32, torch.float16])
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def poison(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not actual.isnan().any(), "NaN in the kernel's output (an unwritten element?)"
    torch.testing.assert_close(actual, expected, **TOL[dtype])


def cos_sin_cache(max_pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)        # [P, D/2]
    return torch.cat((f.cos(), f.sin()), dim=-1).to(DEVICE)                  # [P, D]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- RMSNorm (+ residual)
def _check_rms_norm(rows: int, n: int, dtype: torch.dtype, with_residual: bool, seed: int) -> None:
    g = gen(seed)
    x = (torch.randn(rows, n, generator=g) * 3).to(DEVICE, dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(DEVICE, dtype)
    r = torch.randn(rows, n, generator=g).to(DEVICE, dtype) if with_residual else None
    out, res_out = poison((rows, n), dtype), poison((rows, n), dtype)
    got, got_res = rms_norm(x, w, 1e-6, r, out=out, residual_out=res_out if with_residual else None)
    want, want_res = ref.rms_norm(x, w, 1e-6, r)
    assert got.data_ptr() == out.data_ptr()
    close(got, want, dtype)
    close(got_res, want_res, dtype)
    if not with_residual:
        assert got_res is x


@given(rows=st.integers(1, 9), n=st.sampled_from([5, 17, 96, 123]), dtype=DTYPES,
       with_residual=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm_matches_twin(rows, n, dtype, with_residual, seed):
    _check_rms_norm(rows, n, dtype, with_residual, seed)


def test_rms_norm_leading_dims_and_fresh_outputs():
    x = torch.randn(3, 5, 7, device=DEVICE)        # per-head norm: [T, H, D]
    w = torch.rand(7, device=DEVICE) + 0.5
    got, res = rms_norm(x, w, 1e-5)
    want, _ = ref.rms_norm(x, w, 1e-5)
    assert got.shape == (3, 5, 7) and res is x
    close(got, want, torch.float32)


def test_rms_norm_rejects_bad_shapes():
    x = torch.randn(2, 8, device=DEVICE)
    for fn in (rms_norm, ref.rms_norm):
        with pytest.raises(ValueError, match="weight"):
            fn(x, torch.ones(7, device=DEVICE), 1e-6)
        with pytest.raises(ValueError, match="residual"):
            fn(x, torch.ones(8, device=DEVICE), 1e-6, torch.randn(3, 8, device=DEVICE))


# ---------------------------------------------------------------- rotary
def _check_rotary(t: int, h: int, h_kv: int, d: int, dtype: torch.dtype, inplace: bool, seed: int) -> None:
    g = gen(seed)
    cache = cos_sin_cache(64, d)
    positions = torch.randint(0, 64, (t,), generator=g).to(DEVICE)
    q = torch.randn(t, h, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(t, h_kv, d, generator=g).to(DEVICE, dtype)
    want_q, want_k = ref.rotary(positions, q.clone(), k.clone(), cache)
    if inplace:
        q_in, k_in = q.clone(), k.clone()
        got_q, got_k = rotary(positions, q_in, k_in, cache)
        assert got_q is q_in and got_k is k_in
    else:
        out = (poison(q.shape, dtype), poison(k.shape, dtype))
        q_before, k_before = q.clone(), k.clone()
        got_q, got_k = rotary(positions, q, k, cache, out=out)
        assert got_q is out[0] and got_k is out[1]
        assert torch.equal(q, q_before) and torch.equal(k, k_before), "out-of-place changed its input"
    close(got_q, want_q, dtype)
    close(got_k, want_k, dtype)


@given(t=st.integers(1, 7), h=st.integers(1, 5), h_kv=st.integers(1, 3), d=st.sampled_from([2, 6, 10, 16]),
       dtype=DTYPES, inplace=st.booleans(), seed=st.integers(0, 2**16))
def test_rotary_matches_twin(t, h, h_kv, d, dtype, inplace, seed):
    _check_rotary(t, h, h_kv, d, dtype, inplace, seed)


def test_rotary_twin_is_the_rotation():
    # position p rotates each pair (x_i, x_{i+D/2}) by angle p * inv_freq_i; norms are kept.
    d, cache = 8, cos_sin_cache(16, 8)
    q = torch.randn(4, 3, d, device=DEVICE)
    k = torch.randn(4, 1, d, device=DEVICE)
    pos = torch.tensor([0, 1, 5, 15], device=DEVICE)
    rq, _ = ref.rotary(pos, q.clone(), k.clone(), cache)
    torch.testing.assert_close(rq[0], q[0])                       # position 0: identity
    pair = lambda x: torch.stack((x[..., : d // 2], x[..., d // 2:]), -1).norm(dim=-1)
    torch.testing.assert_close(pair(rq), pair(q))
    assert not torch.allclose(rq[1:], q[1:])


def test_rotary_rejects_bad_shapes():
    cache = cos_sin_cache(8, 6)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    for fn in (rotary, ref.rotary):
        with pytest.raises(ValueError, match="q must be"):
            fn(pos, torch.randn(3, 2, 6, device=DEVICE), torch.randn(2, 1, 6, device=DEVICE), cache)
        with pytest.raises(ValueError, match="k must be"):
            fn(pos, torch.randn(2, 2, 6, device=DEVICE), torch.randn(2, 1, 4, device=DEVICE), cache)


# ---------------------------------------------------------------- per-head RMSNorm + rotary (Qwen3)
def _check_qk_norm_rotary(t: int, h: int, h_kv: int, d: int, dtype: torch.dtype, inplace: bool,
                          seed: int, strided: bool = False) -> None:
    g = gen(seed)
    cache = cos_sin_cache(64, d)
    positions = torch.randint(0, 64, (t,), generator=g).to(DEVICE)
    if strided:     # views of one merged qkv projection, as the model passes them
        qkv = (torch.randn(t, (h + 2 * h_kv) * d, generator=g) * 3).to(DEVICE, dtype)
        q, k, _ = qkv.split([h * d, h_kv * d, h_kv * d], dim=-1)
        q, k = q.view(t, h, d), k.view(t, h_kv, d)
    else:
        q = (torch.randn(t, h, d, generator=g) * 3).to(DEVICE, dtype)
        k = (torch.randn(t, h_kv, d, generator=g) * 3).to(DEVICE, dtype)
    q_w = (torch.rand(d, generator=g) + 0.5).to(DEVICE, dtype)
    k_w = (torch.rand(d, generator=g) + 0.5).to(DEVICE, dtype)
    want_q, want_k = ref.qk_norm_rotary(positions, q.clone(), k.clone(), cache, q_w, k_w, 1e-6)
    # the unfused Triton pair (rms_norm, then rotary) gives the fused kernel's values
    pair_q, pair_k = rotary(positions, rms_norm(q, q_w, 1e-6)[0], rms_norm(k, k_w, 1e-6)[0], cache)
    if inplace:
        q_in, k_in = q.clone(), k.clone()
        got_q, got_k = qk_norm_rotary(positions, q_in, k_in, cache, q_w, k_w, 1e-6)
        assert got_q is q_in and got_k is k_in
    else:
        out = (poison(q.shape, dtype), poison(k.shape, dtype))
        q_before, k_before = q.clone(), k.clone()
        got_q, got_k = qk_norm_rotary(positions, q, k, cache, q_w, k_w, 1e-6, out=out)
        assert got_q is out[0] and got_k is out[1]
        assert torch.equal(q, q_before) and torch.equal(k, k_before), "out-of-place changed its input"
    close(got_q, want_q, dtype)
    close(got_k, want_k, dtype)
    close(got_q, pair_q, dtype)
    close(got_k, pair_k, dtype)


@given(t=st.integers(1, 7), h=st.integers(1, 5), h_kv=st.integers(1, 3), d=st.sampled_from([2, 6, 10, 16]),
       dtype=DTYPES, inplace=st.booleans(), seed=st.integers(0, 2**16), strided=st.booleans())
def test_qk_norm_rotary_matches_twin(t, h, h_kv, d, dtype, inplace, seed, strided):
    _check_qk_norm_rotary(t, h, h_kv, d, dtype, inplace, seed, strided)


def test_qk_norm_rotary_normalises_each_head():
    """Position 0 rotates nothing: the output is each head over its RMS (weights 1), q's heads
    and k's heads with their own weights; a head of zeros stays zeros (eps, no NaN)."""
    d, cache = 8, cos_sin_cache(4, 8)
    q = torch.randn(2, 3, d, device=DEVICE) * 5
    q[1, 2] = 0.0
    k = torch.randn(2, 1, d, device=DEVICE)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    ones, twos = torch.ones(d, device=DEVICE), torch.full((d,), 2.0, device=DEVICE)
    for fn in (qk_norm_rotary, ref.qk_norm_rotary):
        got_q, got_k = fn(pos, q.clone(), k.clone(), cache, ones, twos, 1e-6)
        rms = lambda x: x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        close(got_q, q / rms(q), torch.float32)
        close(got_k, 2 * k / rms(k), torch.float32)
        assert not got_q.isnan().any()


def test_qk_norm_rotary_rejects_bad_weights():
    cache = cos_sin_cache(8, 6)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    q, k = torch.randn(2, 2, 6, device=DEVICE), torch.randn(2, 1, 6, device=DEVICE)
    for fn in (qk_norm_rotary, ref.qk_norm_rotary):
        with pytest.raises(ValueError, match="k_weight must have shape"):
            fn(pos, q, k, cache, torch.ones(6, device=DEVICE), torch.ones(5, device=DEVICE), 1e-6)
        with pytest.raises(ValueError, match="k must be"):
            fn(pos, q, torch.randn(2, 1, 4, device=DEVICE), cache, torch.ones(6, device=DEVICE),
               torch.ones(6, device=DEVICE), 1e-6)


# ---------------------------------------------------------------- SiLU and multiply
def _check_silu_and_mul(rows: int, i: int, dtype: torch.dtype, seed: int) -> None:
    x = (torch.randn(rows, 2 * i, generator=gen(seed)) * 4).to(DEVICE, dtype)
    out = poison((rows, i), dtype)
    got = silu_and_mul(x, out=out)
    assert got is out
    close(got, ref.silu_and_mul(x), dtype)


@given(rows=st.integers(1, 9), i=st.sampled_from([1, 5, 17, 160, 1100]), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_silu_and_mul_matches_twin(rows, i, dtype, seed):
    _check_silu_and_mul(rows, i, dtype, seed)


def test_silu_and_mul_values_and_errors():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0]], device=DEVICE)        # gate (0, 1), up (2, 3)
    want = torch.tensor([[0.0, 3.0 / (1.0 + torch.exp(torch.tensor(-1.0)).item())]], device=DEVICE)
    close(silu_and_mul(x), want, torch.float32)
    close(ref.silu_and_mul(x), want, torch.float32)
    for fn in (silu_and_mul, ref.silu_and_mul):
        with pytest.raises(ValueError, match="even"):
            fn(torch.randn(2, 5, device=DEVICE))


# ---------------------------------------------------------------- rotary + the cache write
def _check_rotary_kv(t: int, h: int, h_kv: int, d: int, dtype: torch.dtype, norm: bool, fp8: bool,
                     seed: int, block_size: int = 4, num_blocks: int = 5) -> None:
    """rotary / qk_norm_rotary with a KVWrite: q and k as without it, and the cache holds exactly
    what write_kv stores from the kernel's own rotated k and v; every other slot is untouched."""
    from toolkit.kernels import reference

    g = gen(seed)
    cos_sin = cos_sin_cache(64, d)
    positions = torch.randint(0, 64, (t,), generator=g).to(DEVICE)
    qkv = (torch.randn(t, (h + 2 * h_kv) * d, generator=g) * 3).to(DEVICE, dtype)
    q, k, v = qkv.split([h * d, h_kv * d, h_kv * d], dim=-1)      # views of one projection
    q, k, v = q.view(t, h, d), k.view(t, h_kv, d), v.view(t, h_kv, d)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[torch.rand(t, generator=g) < 0.25] = -1                 # padding rows: not stored
    slots = slots.to(DEVICE)
    cache_dtype = reference.FP8_DTYPE if fp8 else dtype
    before = torch.randn(2, num_blocks, block_size, h_kv, d, generator=g).to(DEVICE).to(cache_dtype)
    scales = (0.03, 0.05) if fp8 else (1.0, 1.0)
    args = ((torch.rand(d, generator=g) + 0.5).to(DEVICE, dtype),             # q, k weights, eps
            (torch.rand(d, generator=g) + 0.5).to(DEVICE, dtype), 1e-6) if norm else ()
    fast, twin = (qk_norm_rotary, ref.qk_norm_rotary) if norm else (rotary, ref.rotary)
    cache = before.clone()
    out = (poison(q.shape, dtype), poison(k.shape, dtype))
    got_q, got_k = fast(positions, q, k, cos_sin, *args, out=out, kv=ref.KVWrite(v, cache, slots, *scales))
    want_q, want_k = twin(positions, q.clone(), k.clone(), cos_sin, *args)     # no cache write
    close(got_q, want_q, dtype)
    close(got_k, want_k, dtype)
    expect = before.clone()
    reference.write_kv(got_k, v, expect, slots, *scales)
    bits = (lambda x: x.view(torch.uint8)) if fp8 else (lambda x: x)            # noqa: E731
    assert torch.equal(bits(cache), bits(expect)), "the cache differs from write_kv of the rotated k and v"
    twin_cache = before.clone()                                   # the twin's own write, same rule
    twin(positions, q.clone(), k.clone(), cos_sin, *args, out=(torch.empty_like(q), torch.empty_like(k)),
         kv=ref.KVWrite(v, twin_cache, slots, *scales))
    if not fp8:
        close(twin_cache, cache, dtype)


@given(t=st.integers(1, 7), h=st.integers(1, 5), h_kv=st.integers(1, 3), d=st.sampled_from([2, 6, 16]),
       dtype=DTYPES, norm=st.booleans(), fp8=st.booleans(), seed=st.integers(0, 2**16))
def test_rotary_with_cache_write_matches_write_kv(t, h, h_kv, d, dtype, norm, fp8, seed):
    _check_rotary_kv(t, h, h_kv, d, dtype, norm, fp8, seed)


def test_rotary_cache_write_rejects_bad_targets():
    from toolkit.kernels import reference

    cos_sin, pos = cos_sin_cache(8, 6), torch.zeros(2, dtype=torch.int64, device=DEVICE)
    q, k = torch.randn(2, 2, 6, device=DEVICE), torch.randn(2, 1, 6, device=DEVICE)
    cache = torch.zeros(2, 3, 4, 1, 6, device=DEVICE)
    slots = torch.tensor([0, 5], device=DEVICE)
    for fn in (rotary, ref.rotary):
        with pytest.raises(ValueError, match="k and v must both be"):
            fn(pos, q, k, cos_sin, kv=ref.KVWrite(torch.randn(2, 2, 6, device=DEVICE), cache, slots))
        with pytest.raises(ValueError, match="kv_cache must be"):
            fn(pos, q, k, cos_sin, kv=ref.KVWrite(k.clone(), cache[:, :, :, :, :4], slots))
        with pytest.raises(ValueError, match="slot_mapping must be"):
            fn(pos, q, k, cos_sin, kv=ref.KVWrite(k.clone(), cache, slots.float()))
        with pytest.raises(ValueError, match="scale"):
            fn(pos, q, k, cos_sin, kv=ref.KVWrite(k.clone(), cache.to(reference.FP8_DTYPE), slots, 0.0, 1.0))


# ---------------------------------------------------------------- real shapes on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_gpu_bf16(with_residual):
    _check_rms_norm(1000, 4096, torch.bfloat16, with_residual, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary_gpu_bf16(inplace):
    _check_rotary(1000, 32, 8, 128, torch.bfloat16, inplace, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True])
def test_qk_norm_rotary_gpu_bf16(inplace):
    _check_qk_norm_rotary(1000, 16, 8, 128, torch.bfloat16, inplace, 0, strided=not inplace)


@pytest.mark.gpu
@pytest.mark.parametrize("norm, fp8", [(False, False), (True, False), (True, True)])
def test_rotary_with_cache_write_gpu_bf16(norm, fp8):
    _check_rotary_kv(1000, 16, 8, 128, torch.bfloat16, norm, fp8, 0, block_size=16, num_blocks=80)


@pytest.mark.gpu
def test_silu_and_mul_gpu_bf16():
    _check_silu_and_mul(1000, 14336, torch.bfloat16, 0)


# --- the LM head: one GEMM with a float32 output on CUDA, the twin's rounding elsewhere


def test_lm_head_logits_off_cuda_is_the_twin_and_checks_shapes():
    from toolkit.kernels.lm_head import lm_head_logits

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        h, w = torch.randn(5, 24, generator=g).to(dtype), torch.randn(37, 24, generator=g).to(dtype)
        got = lm_head_logits(h, w)
        assert got.dtype == torch.float32 and got.shape == (5, 37)
        assert torch.equal(got, ref.lm_head_logits(h, w))
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\]"):
        lm_head_logits(torch.zeros(2, 3), torch.zeros(4, 5))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_lm_head_logits_into_a_static_buffer(device):
    """out=: the rows of a larger poisoned buffer get exactly the fresh result; nothing else
    is written; a wrong dtype, shape or layout is refused."""
    from toolkit.kernels.lm_head import lm_head_logits

    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(5, 24, generator=g).to(dtype).to(device)
        w = torch.randn(37, 24, generator=g).to(dtype).to(device)
        buf = torch.full((8, 37), float("nan"), device=device)
        got = lm_head_logits(h, w, out=buf[:5])
        assert got.data_ptr() == buf.data_ptr() and torch.equal(buf[:5], lm_head_logits(h, w))
        assert buf[5:].isnan().all()
    for bad in (torch.empty(5, 37, dtype=torch.float16), torch.empty(4, 37),
                torch.empty(37, 5).t()):
        with pytest.raises(ValueError, match="out must be a contiguous float32"):
            lm_head_logits(h.cpu(), w.cpu(), out=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lm_head_logits_gpu_is_the_fp32_product(dtype):
    """On CUDA the half inputs' product in float32 is kept (no half rounding): closer to the exact
    product than the twin, within the twin's rounding of it, and a fresh NaN-free tensor."""
    from toolkit.kernels.lm_head import has_fp32_out_mm, lm_head_logits

    if not has_fp32_out_mm():
        pytest.skip("torch without aten::mm.dtype (torch < 2.8)")
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(256, 1024, device="cuda", generator=g).to(dtype)
    w = (torch.randn(151936, 1024, device="cuda", generator=g) * 0.02).to(dtype)
    got = lm_head_logits(h[::2], w)                          # a strided row view as the engine's gather
    exact = h[::2].float() @ w.float().t()
    twin = ref.lm_head_logits(h[::2], w)
    assert got.dtype == torch.float32 and not got.isnan().any()
    # fp32 accumulation kept: an order of magnitude closer than one half-type rounding
    assert 10 * (got - exact).abs().max() < (twin - exact).abs().max()
    torch.testing.assert_close(got, twin, **TOL[dtype])
