"""Attention over an fp8 (e4m3fn) KV cache with per-layer K/V scales.

Oracle: the cache dequantised (value x scale) to float64 and attended in float64. The torch
twin (TorchAttention) and the CPU backend must match it to fp32 rounding; the Triton kernels
(under TRITON_INTERPRET=1 on the CPU: the interpreter loads e4m3fn and widens it exactly)
must match the twin on ragged layouts, split-KV decode included. Outputs are poisoned with
NaN; unused cache slots hold 448 (the largest e4m3 value: a backend reading one is far off).
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import DEVICE, head_geometry, make_case, poisoned_like, ragged_lengths, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from test_triton_paged import FORCE_SPLIT

from toolkit.attention.cpu import CPUAttention
from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.blocks.kv_cache import KVCache
from toolkit.kernels.reference import quantize_fp8

FP8 = torch.float8_e4m3fn


def fp8_case(h, h_kv, d, bs, kv_lens, q_lens, dtype, seed, num_layers=1, mag=4.0):
    """A make_case layout whose cache is fp8: K/V of magnitude ~mag quantised with per-layer
    scales amax/448 (K) and a coarser one (V, so some V values saturate)."""
    case = make_case(h, h_kv, d, bs, kv_lens, q_lens, dtype, seed, num_layers=num_layers)
    src = case.cache
    cache = KVCache(num_layers, src.num_blocks, bs, h_kv, d, FP8, src.device)
    g = torch.Generator().manual_seed(seed)
    ks, vs = [], []
    for i in range(num_layers):
        kv = torch.randn(src[i].shape, generator=g) * mag
        ks.append(float(kv[0].abs().max()) / 448 * (1 + i))
        vs.append(float(kv[1].abs().max()) / 448 * 0.7)
        cache[i][0] = quantize_fp8(kv[0], ks[i]).to(src.device)
        cache[i][1] = quantize_fp8(kv[1], vs[i]).to(src.device)
    cache.set_scales(ks, vs)
    used = torch.zeros(cache.num_blocks * bs, dtype=torch.bool)
    for table, n in zip(case.tables, kv_lens):
        pos = torch.arange(n)
        used[torch.tensor(table)[pos // bs] * bs + pos % bs] = True
    for layer in cache.layers:
        layer.view(torch.uint8).view(2, -1, h_kv, d)[:, ~used.to(layer.device)] = 0x7E   # 448
    case.cache = cache
    return case


def float64_attention(case, layer, scale, window=None, cap=None) -> torch.Tensor:
    """[T, H, D] float64 from the dequantised cache, one sequence at a time."""
    cache = case.cache[layer]
    ks, vs = case.cache.scales(layer)
    bs, h_kv, d = cache.shape[2:]
    q = case.q.double()
    h = q.shape[1]
    out, row = [], 0
    for table, n_kv, n_q in zip(case.tables, case.kv_lens, case.q_lens):
        pos = torch.arange(n_kv)
        slots = torch.tensor(table)[pos // bs] * bs + pos % bs
        flat = cache.view(2, -1, h_kv, d)[:, slots.to(cache.device)].double()       # [2, S, Hkv, D]
        k = (flat[0] * ks).repeat_interleave(h // h_kv, 1)
        v = (flat[1] * vs).repeat_interleave(h // h_kv, 1)
        s = torch.einsum("qhd,khd->hqk", q[row:row + n_q], k) * scale
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        qp = torch.arange(n_kv - n_q, n_kv)[:, None].to(s.device)
        ok = pos[None, :].to(s.device) <= qp
        if window is not None:
            ok &= pos[None, :].to(s.device) > qp - window
        out.append(torch.einsum("hqk,khd->qhd", torch.softmax(s.masked_fill(~ok, -torch.inf), -1), v))
        row += n_q
    return torch.cat(out)


def run(backend, case, layer=0) -> torch.Tensor:
    backend.plan(case.layout)
    out = poisoned_like(case.q)
    out.copy_(backend.run(layer, case.q))
    return out


@settings(max_examples=20, deadline=None)
@given(lengths=ragged_lengths(max_seqs=4, max_kv=70), geom=head_geometry(head_dims=(16, 32)),
       bs=st.sampled_from([4, 16]), seed=st.integers(0, 2**16),
       window=st.one_of(st.none(), st.integers(1, 40)), cap=st.one_of(st.none(), st.floats(1.0, 30.0)))
def test_twin_and_cpu_backend_match_float64(lengths, geom, bs, seed, window, cap) -> None:
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = fp8_case(h, h_kv, d, bs, kv_lens, q_lens, torch.float32, seed, num_layers=2)
    for layer in (0, 1):
        want = float64_attention(case, layer, d ** -0.5, window, cap)
        for cls in (TorchAttention, CPUAttention):
            got = run(cls(case.cache, h, d, sliding_window=window, soft_cap=cap), case, layer)
            err = rel_err(got, want)
            assert err < 1e-5, f"{cls.__name__} layer {layer}: relative error {err:.2e}"


@settings(max_examples=12, deadline=None)   # the interpreter is slow: small shapes
@given(lengths=ragged_lengths(max_seqs=3, max_kv=64), geom=head_geometry(head_dims=(16, 80)),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16),
       split=st.booleans(), window=st.one_of(st.none(), st.integers(1, 64)))
def test_triton_kernels_match_twin(lengths, geom, dtype, seed, split, window) -> None:
    """Decode and prefill tiles (and split-KV decode merged by LSE) over an fp8 cache."""
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = fp8_case(h, h_kv, d, 16, kv_lens, q_lens, dtype, seed)
    cfg = FORCE_SPLIT if split else None
    want = run(TorchAttention(case.cache, h, d, sliding_window=window), case)
    got = run(TritonPagedAttention(case.cache, h, d, sliding_window=window, config=cfg), case)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3}[dtype]
    err = rel_err(got, want)
    assert err < tol, f"relative error {err:.2e}"
    twin = run(TritonPagedAttention(case.cache, h, d, sliding_window=window, config=cfg,
                                    impl="reference"), case)
    assert rel_err(twin, want) < tol


@pytest.mark.parametrize("split", [False, True])
def test_bf16_queries_take_the_fp16_math_path(split) -> None:
    """bf16 q over an fp8 cache: the kernel attends in fp16 (F16_MATH); still the twin's
    result to bf16 rounding, split decode and a prefill chunk included."""
    case = fp8_case(8, 2, 32, 16, [40, 1, 33], [1, 1, 17], torch.bfloat16, seed=11)
    want = run(TorchAttention(case.cache, 8, 32), case)
    got = run(TritonPagedAttention(case.cache, 8, 32, config=FORCE_SPLIT if split else None), case)
    assert rel_err(got, want) < 2e-2


@pytest.mark.parametrize("cls", [TorchAttention, CPUAttention, TritonPagedAttention])
def test_backends_write_the_twins_bytes(cls) -> None:
    """write_kv of every backend stores quantize_fp8(k / k_scale) of its layer at the slots."""
    case = fp8_case(4, 2, 32, 16, [20, 9], [4, 9], torch.float32, seed=5, num_layers=2)
    backend = cls(case.cache, 4, 32)
    backend.plan(case.layout)
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(case.layout.num_tokens, 2, 32, generator=g).to(DEVICE) * 3 for _ in range(2))
    before = case.cache[1].clone()
    backend.write_kv(1, k, v)
    flat = case.cache[1].view(torch.uint8).view(2, -1, 2, 32)
    slots = case.layout.slot_mapping.long()
    ks, vs = case.cache.scales(1)
    assert torch.equal(flat[0, slots], quantize_fp8(k, ks).view(torch.uint8))
    assert torch.equal(flat[1, slots], quantize_fp8(v, vs).view(torch.uint8))
    rest = torch.ones(flat.shape[1], dtype=torch.bool, device=slots.device)
    rest[slots] = False
    assert torch.equal(flat[:, rest], before.view(torch.uint8).view(2, -1, 2, 32)[:, rest])


def test_kv_cache_scales_are_validated() -> None:
    cache = KVCache(2, 4, 16, 1, 8, FP8)
    assert cache.scales(1) == (1.0, 1.0) and cache.is_fp8
    cache.set_scales([0.1, 0.2], [0.3, 0.4])
    assert cache.scales(1) == (pytest.approx(0.2), pytest.approx(0.4))
    assert cache.scales(0)[0] == float(torch.tensor(0.1, dtype=torch.float32))   # float32 values
    with pytest.raises(ValueError, match="one K and one V scale per layer"):
        cache.set_scales([0.1], [0.3])
    with pytest.raises(ValueError, match="finite and > 0"):
        cache.set_scales([0.1, float("nan")], [0.3, 0.4])
    with pytest.raises(ValueError, match="float8_e4m3fn cache"):
        KVCache(1, 4, 16, 1, 8, torch.float32).set_scales([1.0], [1.0])


GPU_LENGTHS = ([3000, 1, 517, 2048, 70, 1200], [1, 1, 517, 300, 1, 1])   # decode, prompt, chunk


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h,h_kv,d", [(32, 8, 128), (8, 8, 64), (12, 4, 80)])
def test_gpu_real_shapes_fp8(dtype, h, h_kv, d) -> None:
    case = fp8_case(h, h_kv, d, 16, *GPU_LENGTHS, dtype, seed=h * d)
    want = run(TorchAttention(case.cache, h, d), case)
    got = run(TritonPagedAttention(case.cache, h, d), case)
    assert rel_err(got, want) < {torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]


@pytest.mark.gpu
def test_gpu_long_context_split_decode_fp8() -> None:
    case = fp8_case(32, 8, 128, 16, [16384, 9000], [1, 1], torch.bfloat16, seed=3)
    fast = TritonPagedAttention(case.cache, 32, 128)
    fast.plan(case.layout)
    assert fast.schedule is not None and fast.schedule.num_splits > 1
    assert rel_err(run(fast, case), run(TorchAttention(case.cache, 32, 128), case)) < 2e-2
