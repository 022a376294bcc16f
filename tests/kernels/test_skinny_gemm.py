"""The split-K GEMM for few rows against its twin, F.linear in float32 (Triton interpreter on
the CPU, fp16; bf16 on CUDA): odd sizes, both tile orientations, every split count, the
counters left zero, poisoned outputs, and the dispatch that leaves everything else to F.linear."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels.skinny_gemm import SkinnyConfig, SkinnyLinear, make_config, skinny_config, split_for

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float16


def _check(lin: SkinnyLinear, m: int, n: int, k: int, cfg: SkinnyConfig | None = None, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(DEV, DTYPE)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEV, DTYPE)
    got = lin.gemm(x, w, cfg, out=torch.full((m, n), float("nan"), device=DEV, dtype=DTYPE))   # poisoned
    want = F.linear(x.float(), w.float())
    assert got.shape == (m, n) and got.dtype == DTYPE
    assert torch.isfinite(got).all()
    tol = 2e-2 if DTYPE == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    if lin._counters is not None:
        assert not lin._counters.any(), "a launch left a tile counter non-zero"


@settings(max_examples=16, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 150), k=st.integers(1, 300), split=st.integers(1, 5),
       swap=st.booleans(), block_k=st.sampled_from([16, 32]))
def test_split_k_gemm_equals_linear(m, n, k, split, swap, block_k):
    steps = -(-k // block_k)
    split = min(split, steps)
    k_split = -(-steps // split) * block_k
    cfg = SkinnyConfig(block_m=16 if m <= 16 else 64, block_n=32, block_k=block_k, split=-(-k // k_split),
                       k_split=k_split, num_warps=4, num_stages=1, swap=swap)
    _check(SkinnyLinear(sms=4), m, n, k, cfg, seed=m * 1000 + n)


def test_split_for_covers_k_with_no_empty_slice():
    for tiles in (1, 7, 64, 300):
        for k in (1, 100, 1024, 3072, 14336):
            for bk in (16, 64, 256):
                split, k_split = split_for(tiles, k, bk, programs=264)
                assert k_split % bk == 0 and split * k_split >= k > (split - 1) * k_split


def test_default_config_and_reuse_of_counters():
    lin = SkinnyLinear(sms=8)
    for m, n, k in [(1, 64, 256), (16, 96, 512), (33, 40, 384), (3, 200, 130), (70, 48, 200)]:
        cfg = skinny_config(m, n, k, 8)
        assert cfg.split * cfg.k_split >= k > (cfg.split - 1) * cfg.k_split   # no empty split
        assert cfg.swap == (m <= 64)
        _check(lin, m, n, k)
        _check(lin, m, n, k, seed=1)                 # the same counters again


def test_a_config_that_misses_k_is_refused():
    lin = SkinnyLinear(sms=4)
    x, w = torch.randn(4, 64, device=DEV, dtype=DTYPE), torch.randn(32, 64, device=DEV, dtype=DTYPE)
    with pytest.raises(ValueError, match="must cover K = 64"):
        lin.gemm(x, w, SkinnyConfig(16, 32, 16, 1, 32, 4, 1))        # one slice of 32 < 64
    with pytest.raises(ValueError, match="no empty"):
        lin.gemm(x, w, SkinnyConfig(16, 32, 16, 3, 32, 4, 1))        # the third slice is empty


def test_dispatch_leaves_the_rest_to_linear():
    lin = SkinnyLinear(max_rows=8)
    w = torch.randn(24, 32, device=DEV, dtype=DTYPE)
    x = torch.randn(4, 32, device=DEV, dtype=DTYPE)
    assert lin.eligible(x, w, None)
    assert not lin.eligible(torch.randn(9, 32, device=DEV, dtype=DTYPE), w, None)      # too many rows
    assert not lin.eligible(x, w, torch.zeros(24, device=DEV, dtype=DTYPE))            # a bias
    assert not lin.eligible(x.float(), w.float(), None)                                # 32-bit
    assert not lin.eligible(x[:, ::2], w[:, ::2], None)                                # strided K
    b = torch.randn(24, device=DEV, dtype=DTYPE)
    torch.testing.assert_close(lin(x, w, b), F.linear(x, w, b))
    with pytest.raises(ValueError, match="weight must be"):
        lin.gemm(x, torch.randn(24, 31, device=DEV, dtype=DTYPE))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("swap", [True, False])
@pytest.mark.parametrize("m, n, k", [(1, 6144, 1024), (16, 4096, 1024), (64, 1024, 3072), (48, 1024, 2048),
                                     (64, 28672, 4096), (7, 4096, 14336), (256, 1024, 2048), (200, 6144, 1024)])
def test_model_shapes_on_the_gpu(m, n, k, swap):
    """Qwen3-0.6B's and Llama-3.1-8B's projections, both orientations (bf16)."""
    cfg = make_config(m, n, k, block_n=64, block_k=128, programs=264, num_warps=4, num_stages=4, swap=swap)
    _check(SkinnyLinear(), m, n, k, cfg)
