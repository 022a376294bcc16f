"""The split-K GEMM for few rows against its twin, F.linear in float32 (Triton interpreter on
the CPU, fp16; bf16 on CUDA): odd sizes, every split count, the counters left zero, poisoned
outputs, and the dispatch that leaves everything else to F.linear."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels.skinny_gemm import SkinnyConfig, SkinnyLinear, skinny_config

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


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 150), k=st.integers(1, 300), split=st.integers(1, 5))
def test_split_k_gemm_equals_linear(m, n, k, split):
    bk = 16
    steps = -(-k // bk)
    split = min(split, steps)
    k_split = -(-steps // split) * bk
    cfg = SkinnyConfig(block_m=16, block_n=32, block_k=bk, split_k=-(-k // k_split), k_split=k_split,
                       num_warps=4, num_stages=1)
    _check(SkinnyLinear(sms=4), m, n, k, cfg, seed=m * 1000 + n)


def test_default_config_and_reuse_of_counters():
    lin = SkinnyLinear(sms=8)
    for m, n, k in [(1, 64, 256), (16, 96, 512), (33, 40, 384), (3, 200, 130)]:
        cfg = skinny_config(m, n, k, 8)
        assert cfg.split_k * cfg.k_split >= k > (cfg.split_k - 1) * cfg.k_split   # no empty split
        _check(lin, m, n, k)
        _check(lin, m, n, k, seed=1)                 # the same counters again


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
@pytest.mark.parametrize("m, n, k", [(1, 6144, 1024), (16, 4096, 1024), (64, 1024, 3072), (48, 1024, 2048),
                                     (64, 28672, 4096), (7, 4096, 14336)])
def test_model_shapes_on_the_gpu(m, n, k):
    """Qwen3-0.6B's and Llama-3.1-8B's projections with the default tiles (bf16)."""
    _check(SkinnyLinear(), m, n, k)
