"""Bidirectional (causal=False) attention in the Triton paged backend, for encoders whose
prompts run whole: the paged kernel (TRITON_INTERPRET=1 on the CPU, fp32/fp16) and its torch
twin on the same schedule against TorchAttention(causal=False) on ragged whole-prompt batches;
the TMA prefill kernel (self_attention, causal=False) against its twin and dense attention, and
the backend's route through it after write_kv; the
schedule's bidirectional rows (the fast builder equals the reference, every tile sees all of
its sequence's keys); refusals of what bidirectional steps cannot be. A `gpu` test repeats
the comparison in bf16 at a BERT-base shape."""

from __future__ import annotations

import pytest
import torch
from attention_cases import REL_TOL, head_geometry, make_case, poisoned_like, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.schedule import TileConfig, build_schedule, build_schedule_reference
from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.attention.tuning import KernelConfig
from toolkit.kernels import reference_attention
from toolkit.kernels.self_attention import self_attention, tile_table

# small tiles, so short prompts are decode-class (split, merged) and longer ones span several
# prefill tiles with masked tails
SMALL = KernelConfig(decode=TileConfig(4, 16, 4, 1), prefill=TileConfig(16, 16, 4, 1),
                     target_programs=1 << 20, min_split_tokens=16)


def check(case, impl: str, cap: float | None = None, config: KernelConfig | None = None) -> float:
    h, d = case.q.shape[1], case.q.shape[2]
    ref = TorchAttention(case.cache, h, d, soft_cap=cap, causal=False)
    fast = TritonPagedAttention(case.cache, h, d, soft_cap=cap, config=config, impl=impl, causal=False)
    ref.plan(case.layout)
    fast.plan(case.layout)
    out = poisoned_like(case.q)
    assert fast.run(0, case.q, out=out) is out
    want = ref.run(0, case.q)
    err = rel_err(out, want)
    assert err < REL_TOL[case.q.dtype], f"relative error {err:.2e} ({fast!r})"
    if max(case.kv_lens) > 1:     # the causal result differs: the first token sees later ones here
        causal = TorchAttention(case.cache, h, d, soft_cap=cap)
        causal.plan(case.layout)
        assert rel_err(causal.run(0, case.q), want) > 1e-3
    return err


@settings(max_examples=8, deadline=None)
@given(lens=st.lists(st.integers(1, 70), min_size=1, max_size=4), geom=head_geometry((16, 32, 48)),
       bs=st.sampled_from([4, 16]), dtype=st.sampled_from([torch.float32, torch.float16]),
       cap=st.one_of(st.none(), st.floats(1.0, 30.0)), small=st.booleans(), seed=st.integers(0, 2**16))
def test_triton_kernel_matches_twin_on_whole_prompts(lens, geom, bs, dtype, cap, small, seed) -> None:
    h, h_kv, d = geom
    case = make_case(h, h_kv, d, bs, lens, lens, dtype, seed)
    check(case, "triton", cap, SMALL if small else None)


@settings(max_examples=10, deadline=None)
@given(lens=st.lists(st.integers(1, 90), min_size=1, max_size=5), geom=head_geometry((16, 32)),
       small=st.booleans(), seed=st.integers(0, 2**16))
def test_reference_kernels_on_the_schedule_match_twin(lens, geom, small, seed) -> None:
    """The kernels' torch twins (the CPU path without the interpreter) on the same schedule."""
    h, h_kv, d = geom
    check(make_case(h, h_kv, d, 8, lens, lens, torch.float32, seed), "reference", None,
          SMALL if small else None)


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=8), block_q=st.sampled_from([1, 4, 8]),
       block_n=st.sampled_from([16, 32]), target=st.sampled_from([0, 64, 1 << 20]))
def test_bidirectional_schedule_rows_see_every_key(lens, block_q, block_n, target) -> None:
    qo, kvp = [0], [0]
    for n in lens:
        qo.append(qo[-1] + n)
        kvp.append(kvp[-1] + -(-n // 16))
    args = {"num_kv_heads": 2, "decode": TileConfig(block_q, block_n, 4, 1), "prefill": TileConfig(16, 32, 4, 1),
            "window": None, "target_programs": target, "min_split_tokens": 16, "causal": False}
    fast, ref = build_schedule(qo, lens, kvp, **args), build_schedule_reference(qo, lens, kvp, **args)
    assert fast.decode.tolist() == ref.decode and fast.prefill.tolist() == ref.prefill
    assert fast.merge_rows.tolist() == ref.merge_rows
    for rows in (ref.prefill, [w for w in ref.decode if w[9] == 0 and w[4] == 0]):
        for q0, n_q, first, _, start, full_lo, full_hi, hi, _, _ in rows:
            b = max(i for i in range(len(lens)) if qo[i] <= q0)
            assert first == q0 - qo[b]                 # the rows keep their true positions
            if rows is ref.prefill:                    # unsplit: the whole sequence, unmasked but the tail
                assert (start, full_lo, hi) == (0, 0, lens[b])
                assert full_hi == lens[b] // 32 * 32


def test_refuses_windows_and_partial_prompts() -> None:
    case = make_case(4, 2, 16, 4, [9, 5], [9, 5], torch.float32, 0)
    with pytest.raises(ValueError, match="sliding window"):
        TritonPagedAttention(case.cache, 4, 16, sliding_window=4, causal=False)
    chunk = make_case(4, 2, 16, 4, [9, 5], [9, 3], torch.float32, 0)
    fast = TritonPagedAttention(chunk.cache, 4, 16, impl="reference", causal=False)
    with pytest.raises(ValueError, match="whole prompts"):
        fast.plan(chunk.layout)
    assert "bidirectional" in repr(fast)


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [S, H, D], k, v [S, Hkv, D] of one sequence, every key visible -> [S, H, D] fp32."""
    g = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    p = torch.softmax(torch.einsum("qhd,khd->hqk", q.float(), k) * scale, -1)
    return torch.einsum("hqk,khd->qhd", p, v)


@settings(max_examples=8, deadline=None)
@given(lens=st.lists(st.integers(1, 70), min_size=1, max_size=3), group=st.sampled_from([1, 2, 4]),
       h_kv=st.integers(1, 2), d=st.sampled_from([16, 32]), dtype=st.sampled_from([torch.float32, torch.float16]),
       tiles=st.sampled_from([(32, 16), (16, 16), (64, 32)]), seed=st.integers(0, 2**16))
def test_tma_prefill_kernel_bidirectional(lens, group, h_kv, d, dtype, tiles, seed) -> None:
    """self_attention(causal=False) against its twin, and the twin against dense attention per
    sequence; k / v strided views of one QKV tensor, as the model passes them."""
    h, t = group * h_kv, sum(lens)
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (h + 2 * h_kv) * d, generator=gen).to(dtype)
    q, k, v = (qkv[:, : h * d].view(t, h, d), qkv[:, h * d:(h + h_kv) * d].view(t, h_kv, d),
               qkv[:, (h + h_kv) * d:].view(t, h_kv, d))
    table = tile_table(lens, tiles[0], "cpu")
    out, lse = poisoned_like(q), torch.full((t, h), float("nan"))
    self_attention(q, k, v, table, out, lse, scale=d ** -0.5, block_m=tiles[0], block_n=tiles[1],
                   num_warps=4, num_stages=2, causal=False)
    want, want_lse = torch.empty(q.shape), torch.empty(t, h)
    reference_attention.self_attention(q, k, v, table, want, want_lse, scale=d ** -0.5, causal=False)
    assert rel_err(out, want) < 2 * REL_TOL[dtype]
    torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        assert rel_err(want[sl], dense(q[sl], k[sl], v[sl], d ** -0.5)) < 1e-5
        start += n
    with pytest.raises(ValueError, match="no kv_cache prefix"):
        self_attention(q, k, v, table, out, scale=1.0, kv_cache=torch.zeros(2, 1, 4, h_kv, d, dtype=dtype),
                       kv_indices=torch.zeros(1, dtype=torch.int32), causal=False)


def test_backend_takes_the_tma_path_after_write_kv() -> None:
    """Whole fp16 prompts (one shorter than a decode tile, so on the paged kernel) with this
    step's K/V from write_kv: the long ones on the TMA kernel, all equal to the twin."""
    h, h_kv, d = 4, 2, 16
    case = make_case(h, h_kv, d, 16, [70, 3, 33], [70, 3, 33], torch.float16, 0)
    fast = TritonPagedAttention(case.cache, h, d, causal=False)
    ref = TorchAttention(case.cache, h, d, causal=False)
    fast.plan(case.layout)
    ref.plan(case.layout)
    kv = case.cache[0].flatten(1, 2)[:, case.layout.slot_mapping.long()]    # [2, T, H_kv, D]
    qkv = torch.empty(kv.shape[1], (h + 2 * h_kv) * d, dtype=kv.dtype)
    qkv[:, (h + h_kv) * d:] = kv[1].flatten(1)
    fast.write_kv(0, kv[0].contiguous(), qkv[:, (h + h_kv) * d:].view(-1, h_kv, d))
    out = poisoned_like(case.q)
    fast.run(0, case.q, out=out)
    assert fast.num_self_prefill_launches == 1
    assert rel_err(out, ref.run(0, case.q)) < REL_TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bert_base_shape_on_gpu(dtype) -> None:
    """BERT-base's attention (12 heads of 64) over a ragged batch of 64 prompts up to 512
    tokens, with the default tiles, against the twin: the paged kernel, then (after this
    step's write_kv) the TMA prefill kernel where the GPU has it."""
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 513, (64,), generator=gen).tolist()
    case = make_case(12, 12, 64, 16, lens, lens, dtype, 0)
    check(case, "triton")
    fast, ref = TritonPagedAttention(case.cache, 12, 64, causal=False), TorchAttention(case.cache, 12, 64, causal=False)
    fast.plan(case.layout)
    ref.plan(case.layout)
    kv = case.cache[0].flatten(1, 2)[:, case.layout.slot_mapping.long()]    # [2, T, H_kv, D]
    fast.write_kv(0, kv[0].contiguous(), kv[1].contiguous())
    out = poisoned_like(case.q)
    fast.run(0, case.q, out=out)
    assert fast.num_self_prefill_launches == int(fast._self_tile is not None)
    assert rel_err(out, ref.run(0, case.q)) < REL_TOL[dtype]
