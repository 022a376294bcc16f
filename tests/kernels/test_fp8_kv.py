"""FP8 (e4m3fn) KV cache: the write kernel against its torch twin, bit for bit, and the twin
against a float64 model of e4m3 rounding.

Triton's CPU interpreter loads and stores float8_e4m3fn (as bytes) and widens it exactly,
except that it reads the NaN code 0x7F as 480; its own fp32 -> fp8 cast is wrong (a rounding
that carries into the exponent is dropped, NaN becomes 384), which is why write_kv encodes
the bits itself: these tests compare bytes, so they hold on the interpreter and the GPU alike.
Caches are poisoned with the NaN byte 0x7F so that a slot written by mistake, or not
written, shows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels import dispatch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
POISON = 0x7F                   # e4m3fn NaN


def e4m3_grid() -> torch.Tensor:
    """Every finite e4m3fn value, float64, sorted."""
    vals = torch.arange(256, dtype=torch.uint8).view(FP8).double()
    return vals[~vals.isnan()].unique().sort().values


def nearest_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float64 model: x (float64) saturated to +-448, rounded to the nearest e4m3 value, ties to
    the even code; NaN stays NaN."""
    grid = e4m3_grid()
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    even = {float(v): int(c) % 2 == 0 for c, v in zip(codes.view(torch.uint8), codes.double()) if v == v}
    xs = x.clamp(-448, 448)
    i = torch.searchsorted(grid, xs).clamp(1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (hi - xs < xs - lo) | ((hi - xs == xs - lo) & torch.tensor([even[float(h)] for h in hi]))
    out = torch.where(pick_hi, hi, lo)
    return torch.where(x.isnan(), x, out)


@st.composite
def fp8_write_cases(draw):  # -> (k, v, cache, slots, k_scale, v_scale)
    t = draw(st.integers(1, 6))
    h = draw(st.integers(1, 3))
    d = draw(st.sampled_from([5, 64, 80, 97]))
    bs = draw(st.sampled_from([1, 3, 16]))
    nb = draw(st.integers(-(-t // bs), -(-t // bs) + 2))
    kv_dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    slots = draw(st.permutations(range(nb * bs)))[:t]                   # distinct slots
    skip = draw(st.lists(st.booleans(), min_size=t, max_size=t))
    slots = [-1 if s else x for x, s in zip(slots, skip)]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    # magnitudes from e4m3's subnormals to beyond its saturation, some exact ties, some NaN/inf
    mag = draw(st.sampled_from([1e-3, 0.05, 1.0, 30.0, 600.0]))
    if draw(st.booleans(), label="strided k/v"):                        # views of a fused qkv
        qkv = (torch.randn(t, 3 * h, d, generator=g) * mag).to(kv_dtype)
        k, v = qkv[:, h:2 * h], qkv[:, 2 * h:]
    else:
        k, v = ((torch.randn(t, h, d, generator=g) * mag).to(kv_dtype) for _ in range(2))
    if draw(st.booleans(), label="ties and specials"):
        grid = e4m3_grid().float()
        ties = ((grid[1:] + grid[:-1]) / 2)[torch.randint(len(grid) - 1, (t, h, d), generator=g)]
        k = torch.where(torch.rand(t, h, d, generator=g) < 0.5, ties.to(kv_dtype), k)
        k.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])[: k.numel()].to(kv_dtype)
    k_scale = draw(st.sampled_from([1.0, 0.37, 2.5e-3]))
    v_scale = draw(st.sampled_from([1.0, 0.11, 7.0]))
    cache = torch.full((2, nb, bs, h, d), POISON, dtype=torch.uint8).view(FP8)
    idx_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    return (k.to(DEV), v.to(DEV), cache.to(DEV), torch.tensor(slots, dtype=idx_dtype, device=DEV),
            k_scale, v_scale)


@settings(max_examples=25)
@given(fp8_write_cases())
def test_fp8_write_kv_matches_twin_bitwise(case) -> None:
    k, v, cache, slots, ks, vs = case
    want = cache.clone()
    reference.write_kv(k, v, want, slots, ks, vs)
    dispatch.write_kv(k, v, cache, slots, ks, vs, backend="triton")
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
    # exactly the written slots changed: a written K is never the poison byte unless k was NaN
    flat = cache.view(torch.uint8).view(2, -1, *cache.shape[3:])
    written = torch.zeros(flat.shape[1], dtype=torch.bool, device=flat.device)
    written[slots[slots >= 0].long()] = True
    assert (flat[:, ~written] == POISON).all()
    kk = k[slots >= 0]
    stored = flat[0, slots[slots >= 0].long()]
    assert torch.equal(stored == POISON, kk.isnan())   # + NaN -> the NaN byte, nothing else


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), scale=st.floats(1e-3, 10.0), mag=st.sampled_from([1e-4, 1e-2, 1.0, 1e3]))
def test_twin_rounds_like_float64_model(seed, scale, mag) -> None:
    """quantize_fp8 = nearest e4m3 value of x / scale (float32 division), saturating; the
    dequantised value is within half an e4m3 step of x (relative 2^-4, absolute 2^-10 x scale)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, generator=g) * mag
    x[:4] = torch.tensor([float("nan"), 1e9, -1e9, 0.0])
    q = reference.quantize_fp8(x, scale)
    scaled = (x / torch.tensor(scale, dtype=torch.float32)).double()
    want = nearest_e4m3(scaled)
    got = q.double()
    assert torch.equal(got.isnan(), x.isnan())
    ok = ~x.isnan()
    assert torch.equal(got[ok], want[ok])
    deq = reference.dequantize(q, scale).double()
    inside = ok & (scaled.abs() <= 448)
    bound = 2.0**-4 * x.double().abs() + 2.0**-10 * scale
    assert ((deq - x.double()).abs()[inside] <= bound[inside] * (1 + 1e-6)).all()


def test_scales_are_checked() -> None:
    k = torch.randn(2, 1, 4, device=DEV)
    slots = torch.tensor([0, 1], device=DEV)
    fp8 = torch.zeros(2, 1, 2, 1, 4, device=DEV).to(FP8)
    with pytest.raises(ValueError, match="finite scales > 0"):
        dispatch.write_kv(k, k, fp8, slots, 0.0, 1.0)
    with pytest.raises(ValueError, match="float8_e4m3fn cache only"):
        dispatch.write_kv(k, k, torch.zeros(2, 1, 2, 1, 4, device=DEV), slots, 0.5, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_write_kv_real_shapes(head_dim: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    t, h, nb, bs = 8192, 8, 1024, 16
    k, v = (torch.randn(t, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) * 3
            for _ in range(2))
    k[0, 0, :3] = torch.tensor([float("nan"), float("inf"), 1e4])
    slots = torch.randperm(nb * bs, device="cuda", generator=g)[:t]
    slots[::7] = -1
    cache = torch.full((2, nb, bs, h, head_dim), POISON, device="cuda", dtype=torch.uint8).view(FP8)
    want = cache.clone()
    reference.write_kv(k, v, want, slots, 0.02, 0.013)
    dispatch.write_kv(k, v, cache, slots, 0.02, 0.013)                  # auto: Triton on CUDA
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
