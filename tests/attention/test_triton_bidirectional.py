"""Bidirectional (causal=False) attention in the Triton paged backend, for encoders whose
prompts run whole: the kernel (TRITON_INTERPRET=1 on the CPU, fp32/fp16) and its torch twin on
the same schedule against TorchAttention(causal=False) on ragged whole-prompt batches; the
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
    args = dict(num_kv_heads=2, decode=TileConfig(block_q, block_n, 4, 1), prefill=TileConfig(16, 32, 4, 1),
                window=None, target_programs=target, min_split_tokens=16, causal=False)
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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bert_base_shape_on_gpu(dtype) -> None:
    """BERT-base's attention (12 heads of 64) over a ragged batch of 64 prompts up to 512
    tokens, with the default tiles, against the twin."""
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 513, (64,), generator=gen).tolist()
    case = make_case(12, 12, 64, 16, lens, lens, dtype, 0)
    check(case, "triton")
