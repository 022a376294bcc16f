"""Cache kernels (write_kv, copy_blocks) against their torch twins.

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 (set in tests/conftest.py) on
small odd shapes in fp32/fp16 (the interpreter gets bf16 arithmetic wrong); with CUDA the
same tests run compiled, and the `gpu` tests add real shapes in bf16. Caches are poisoned
with NaN so that a slot written by mistake, or one not written, shows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from toolkit.kernels import dispatch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NAN = float("nan")


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@st.composite
def write_cases(draw):  # -> (k, v, cache, slots)
    t = draw(st.integers(1, 6))
    h = draw(st.integers(1, 3))
    d = draw(st.sampled_from([5, 64, 80, 97]))
    bs = draw(st.sampled_from([1, 3, 16]))
    nb = draw(st.integers(-(-t // bs), -(-t // bs) + 2))
    cache_dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    kv_dtype = draw(st.sampled_from([cache_dtype, torch.float32]))     # the store converts
    slots = draw(st.permutations(range(nb * bs)))[:t]                   # distinct slots
    skip = draw(st.lists(st.booleans(), min_size=t, max_size=t))
    slots = [-1 if s else x for x, s in zip(slots, skip)]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if draw(st.booleans(), label="strided k/v"):                        # k, v as views of a fused qkv
        qkv = torch.randn(t, 3 * h, d, generator=g).to(kv_dtype)
        k, v = qkv[:, h:2 * h], qkv[:, 2 * h:]
    else:
        k, v = (torch.randn(t, h, d, generator=g).to(kv_dtype) for _ in range(2))
    cache = torch.full((2, nb, bs, h, d), NAN, dtype=cache_dtype)
    idx_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    return k.to(DEV), v.to(DEV), cache.to(DEV), torch.tensor(slots, dtype=idx_dtype, device=DEV)


@given(write_cases())
def test_write_kv_matches_twin(case) -> None:
    k, v, cache, slots = case
    want = cache.clone()
    reference.write_kv(k, v, want, slots)
    dispatch.write_kv(k, v, cache, slots, backend="triton")
    assert_same(cache, want)
    # poison: exactly the slots written hold numbers, every other slot (and -1 tokens) keeps NaN
    flat = cache.view(2, -1, *cache.shape[3:]).isnan().all(-1).all(-1)   # [2, slots]
    written = torch.zeros_like(flat[0])
    written[slots[slots >= 0].long()] = True
    assert torch.equal(~flat[0], written) and torch.equal(~flat[1], written)


@st.composite
def copy_cases(draw):  # -> (caches, src, dst)
    nb = draw(st.integers(2, 8))
    n = draw(st.integers(1, nb // 2))
    blocks = draw(st.permutations(range(nb)))
    dst = blocks[:n]                                                    # distinct, disjoint from src
    src = draw(st.lists(st.sampled_from(blocks[n:]), min_size=n, max_size=n))
    layers = draw(st.integers(1, 3))
    bs = draw(st.sampled_from([1, 3, 16]))
    h = draw(st.integers(1, 3))
    d = draw(st.sampled_from([5, 64, 80, 97]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    caches = [torch.randn(2, nb, bs, h, d, generator=g).to(dtype).to(DEV) for _ in range(layers)]
    as_t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEV)
    return caches, as_t(src), as_t(dst)


@given(copy_cases())
def test_copy_blocks_matches_twin(case) -> None:
    caches, src, dst = case
    want = [c.clone() for c in caches]
    reference.copy_blocks(want, src, dst)
    dispatch.copy_blocks(caches, src, dst, backend="triton")
    for got, w in zip(caches, want):
        assert torch.equal(got, w)


def test_dispatch_picks_by_device_and_validates() -> None:
    assert dispatch.use_triton(torch.empty(1), "auto") is False
    assert dispatch.use_triton(torch.empty(1), "triton") is True
    with pytest.raises(ValueError, match="valid: .*'auto'"):
        dispatch.use_triton(torch.empty(1), "cuda")
    k = torch.randn(2, 1, 4)
    cache = torch.full((2, 2, 2, 1, 4), NAN)
    dispatch.write_kv(k, k, cache, torch.tensor([3, -1]))              # CPU: the twin
    assert torch.equal(cache[0, 1, 1], k[0]) and cache[:, 0].isnan().all()


def test_kernels_reject_bad_shapes() -> None:
    from toolkit.kernels.copy_blocks import copy_blocks
    from toolkit.kernels.write_kv import write_kv

    k = torch.randn(2, 1, 4, device=DEV)
    with pytest.raises(ValueError, match=r"kv_cache must be \[2, num_blocks, block_size, 1, 4\]"):
        write_kv(k, k, torch.empty(2, 2, 2, 1, 8, device=DEV), torch.tensor([0, 1], device=DEV))
    with pytest.raises(ValueError, match="slot_mapping must be an integer tensor"):
        write_kv(k, k, torch.empty(2, 2, 2, 1, 4, device=DEV), torch.tensor([0.0, 1.0], device=DEV))
    with pytest.raises(ValueError, match="one length"):
        copy_blocks([torch.empty(2, 2, 2, 1, 4, device=DEV)], torch.tensor([0], device=DEV),
                    torch.tensor([1, 0], device=DEV))


# -- real shapes on a GPU, bf16 --

@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_write_kv_real_shapes_bf16(head_dim: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    t, h, nb, bs = 8192, 8, 1024, 16
    k, v = (torch.randn(t, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    slots = torch.randperm(nb * bs, device="cuda", generator=g)[:t]
    slots[::7] = -1
    cache = torch.full((2, nb, bs, h, head_dim), NAN, device="cuda", dtype=torch.bfloat16)
    want = cache.clone()
    reference.write_kv(k, v, want, slots)
    dispatch.write_kv(k, v, cache, slots)                               # auto: Triton on CUDA
    assert_same(cache, want)


@pytest.mark.gpu
def test_copy_blocks_real_shapes_bf16() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    nb = 512
    caches = [torch.randn(2, nb, 16, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(8)]
    perm = torch.randperm(nb, device="cuda", generator=g)
    src, dst = perm[:64], perm[64:128]
    want = [c.clone() for c in caches]
    reference.copy_blocks(want, src, dst)
    dispatch.copy_blocks(caches, src, dst)
    for got, w in zip(caches, want):
        assert torch.equal(got, w)
