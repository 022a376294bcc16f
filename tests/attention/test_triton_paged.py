"""TritonPagedAttention against TorchAttention (the reference twin) on ragged paged layouts.

On the CPU the Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py) at small
shapes in fp32/fp16; the output buffer is poisoned with NaN so an unwritten element fails.
`gpu` tests repeat this at real shapes in bf16/fp16.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    REL_TOL,
    head_geometry,
    make_case,
    poisoned_like,
    ragged_lengths,
    rel_err,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.schedule import TileConfig
from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.attention.tuning import KernelConfig
from toolkit.registry import lookup

WINDOWS = st.one_of(st.none(), st.integers(1, 64))
CAPS = st.one_of(st.none(), st.floats(1.0, 30.0))


def check(case, window=None, cap=None, scale=None, config=None, impl="auto", layer=0) -> float:
    h, d = case.q.shape[1], case.q.shape[2]
    ref = TorchAttention(case.cache, h, d, scale=scale, sliding_window=window, soft_cap=cap)
    fast = TritonPagedAttention(case.cache, h, d, scale=scale, sliding_window=window, soft_cap=cap,
                                config=config, impl=impl)
    ref.plan(case.layout)
    fast.plan(case.layout)
    out = poisoned_like(case.q)
    assert fast.run(layer, case.q, out=out) is out
    err = rel_err(out, ref.run(layer, case.q))
    assert err < REL_TOL[case.q.dtype], f"relative error {err:.2e} ({fast!r})"
    return err


@given(lengths=ragged_lengths(), geom=head_geometry(), bs=st.sampled_from([16, 32, 64]),
       dtype=st.sampled_from([torch.float32, torch.float16]), window=WINDOWS, cap=CAPS,
       seed=st.integers(0, 2**16))
def test_ragged_layouts_match_reference(lengths, geom, bs, dtype, window, cap, seed) -> None:
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    check(make_case(h, h_kv, d, bs, kv_lens, q_lens, dtype, seed), window, cap)


FORCE_SPLIT = KernelConfig(decode=TileConfig(4, 16, 4, 1), prefill=TileConfig(8, 16, 4, 1),
                           target_programs=1 << 20, min_split_tokens=16)


@settings(max_examples=10)
@given(lengths=ragged_lengths(max_kv=120), geom=head_geometry((32, 64)), window=WINDOWS,
       seed=st.integers(0, 2**16))
def test_split_kv_merge_matches_reference(lengths, geom, window, seed) -> None:
    """Every decode-class sequence split into 16-key pieces, merged by log-sum-exp."""
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = make_case(h, h_kv, d, 16, kv_lens, q_lens, torch.float32, seed)
    check(case, window, config=FORCE_SPLIT)


# decode tiles of up to 4 query tokens at 1 warp: with a group of 4 and head_dim 128 the fused
# merge loads 4 splits at a time (merge_chunk), and a 120-key context splits in 8 (two chunks)
ONE_WARP_SPLIT = KernelConfig(decode=TileConfig(4, 16, 1, 1), prefill=TileConfig(8, 16, 4, 1),
                              target_programs=1 << 20, min_split_tokens=16)


@pytest.mark.parametrize("fused", [True, False])
def test_fused_merge_matches_reference_and_leaves_counters_zero(fused) -> None:
    """The split launch that merges its own partials (the last split of a sequence merges)
    against the reference, over more splits than one merge chunk and tiles of several query
    tokens; every launch leaves the done-counters zero, so a second run is the same."""
    from dataclasses import replace

    from toolkit.kernels.paged_attention import merge_chunk

    case = make_case(8, 2, 128, 16, [120, 97, 40, 7], [1, 3, 4, 2], torch.float32, seed=3)
    cfg = replace(ONE_WARP_SPLIT, fused_merge=fused)
    fast = TritonPagedAttention(case.cache, 8, 128, config=cfg)
    ref = TorchAttention(case.cache, 8, 128)
    fast.plan(case.layout)
    ref.plan(case.layout)
    assert fast.schedule.num_splits > merge_chunk(4, 128, 1)
    expected = ref.run(0, case.q)
    merges = []
    merge = fast._merge
    fast._merge = lambda *a: (merges.append(1), merge(*a))[1]
    for _ in range(2):
        out = poisoned_like(case.q)
        fast.run(0, case.q, out=out)
        assert rel_err(out, expected) < REL_TOL[torch.float32]
        if fused:
            assert fast._counters is not None and not fast._counters.any()
    assert len(merges) == (0 if fused else 2)


def test_fused_merge_needs_counters() -> None:
    from toolkit.kernels.reference_attention import paged_attention

    case = make_case(4, 2, 16, 16, [70], [1], torch.float32)
    fast = TritonPagedAttention(case.cache, 4, 16, config=FORCE_SPLIT)
    fast.plan(case.layout)
    work = fast._tables()
    args = (case.q, case.cache[0], fast.kv_indices, work["decode"], torch.empty_like(case.q),
            fast._part_out, fast._part_lse)
    kw = dict(scale=0.25, soft_cap=None, sliding_window=None, num_q_per_kv=2, block_q=4, block_n=16)
    with pytest.raises(ValueError, match="int32 counters, at least merge rows x KV heads = 2"):
        paged_attention(*args, **kw, merge_rows=work["merge"], counters=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"merge_rows must be contiguous int32 \[R, 2\]"):
        paged_attention(*args, **kw, merge_rows=work["merge"].t(), counters=torch.zeros(8, dtype=torch.int32))


@pytest.mark.parametrize("batch", [2, 9])                 # 4 / 18 programs at 2 KV heads
@pytest.mark.parametrize("kv_len", [5, 70])              # unsplit / split
def test_decode_tile_by_launch_size(batch, kv_len) -> None:
    """A decode launch of many programs (split rows counted) takes `decode_many` (1 warp), a
    small one the default tile; both give the reference's output, and the choice is the
    launched grid's."""
    from toolkit.attention.tuning import default_config

    case = make_case(4, 2, 16, 16, [kv_len] * batch, [1] * batch, torch.float16, batch + kv_len)
    cfg = default_config(torch.float16, 16, 2, torch.device("cpu"))
    fast = TritonPagedAttention(case.cache, 4, 16, config=cfg)
    fast.plan(case.layout)
    programs = len(fast.schedule.decode) * 2
    assert cfg.decode_tile(programs) == (cfg.decode_many if programs >= cfg.many_programs else cfg.decode)
    used = []
    fast._attn = lambda *a, **kw: (used.append(kw["num_warps"]), attn(*a, **kw))[1]
    attn = type(fast)._kernels(True)[0]
    fast.run(0, case.q)
    many = programs >= cfg.many_programs
    assert used[0] == (cfg.decode_many if many else cfg.decode).num_warps
    check(case, config=cfg)


def test_split_launch_of_many_programs_takes_decode_many() -> None:
    """Splits count as programs: 2 sequences x 2 KV heads (4 programs, under the many rule's 6)
    split in 2 make 8, and that launch takes decode_many."""
    from dataclasses import replace

    from toolkit.attention.tuning import default_config

    case = make_case(4, 2, 16, 16, [70, 70], [1, 1], torch.float16, 7)
    cfg = replace(default_config(torch.float16, 16, 2, torch.device("cpu")), many_programs=6)
    fast = TritonPagedAttention(case.cache, 4, 16, config=cfg)
    fast.plan(case.layout)
    assert fast.schedule.split and len(fast.schedule.decode) * 2 >= 6
    used = []
    attn = type(fast)._kernels(True)[0]
    fast._attn = lambda *a, **kw: (used.append((kw["num_warps"], kw["block_n"])), attn(*a, **kw))[1]
    fast.run(0, case.q)
    assert used[0] == (cfg.decode_many.num_warps, cfg.decode_many.block_n)
    check(case, config=cfg)


def test_decode_many_keeps_the_decode_block_q() -> None:
    with pytest.raises(ValueError, match="decode_many must keep decode's block_q"):
        KernelConfig(decode=TileConfig(4, 16, 4, 1), prefill=TileConfig(8, 16, 4, 1), target_programs=8,
                     min_split_tokens=16, decode_many=TileConfig(8, 16, 1, 1), many_programs=4)


@settings(max_examples=20)
@given(lengths=ragged_lengths(max_kv=120), seed=st.integers(0, 2**16))
def test_work_tables_start_at_16_byte_boundaries(lengths, seed) -> None:
    """Triton specializes a kernel on its pointers' 16-byte alignment: a work table at a
    step-dependent offset would compile a new variant inside generate (seen on the H200)."""
    kv_lens, q_lens = lengths
    case = make_case(4, 2, 16, 16, kv_lens, q_lens, torch.float32, seed)
    fast = TritonPagedAttention(case.cache, 4, 16, config=FORCE_SPLIT, impl="reference")
    fast.plan(case.layout)
    for name, t in fast._tables().items():
        assert t.data_ptr() % 16 == 0, (name, t.storage_offset())


@settings(max_examples=10)
@given(lengths=ragged_lengths(), geom=head_geometry(), window=WINDOWS, cap=CAPS,
       seed=st.integers(0, 2**16))
def test_reference_twins_on_the_same_schedule(lengths, geom, window, cap, seed) -> None:
    """The kernels' torch twins (the CPU path) follow the same work tables."""
    (kv_lens, q_lens), (h, h_kv, d) = lengths, geom
    case = make_case(h, h_kv, d, 16, kv_lens, q_lens, torch.float32, seed)
    check(case, window, cap, config=FORCE_SPLIT, impl="reference")


@pytest.mark.parametrize("kv_lens,q_lens", [
    ([1], [1]),                             # one token, batch of one
    ([130], [1]),                           # decode over a partly filled last block
    ([64], [64]),                           # whole prompt, exactly full blocks
    ([5, 97, 1, 40], [5, 1, 1, 17]),        # mixed batch: prompt, decode, chunk after a prefix
])
def test_edge_layouts(kv_lens, q_lens) -> None:
    check(make_case(8, 2, 64, 16, kv_lens, q_lens, torch.float32, seed=1), scale=0.3)


def test_second_layer_and_write_kv_match_reference() -> None:
    """write_kv stores at slot_mapping like the reference; run reads the asked-for layer."""
    case = make_case(4, 2, 32, 16, [20, 9], [4, 9], torch.float32, num_layers=2)
    fast = TritonPagedAttention(case.cache, 4, 32)
    fast.plan(case.layout)
    k, v = torch.randn(2, case.layout.num_tokens, 2, 32, device=case.q.device)
    before = case.cache[1].clone()
    fast.write_kv(1, k, v)
    flat = case.cache[1].view(2, -1, 2, 32)
    slots = case.layout.slot_mapping.long()
    assert torch.equal(flat[0, slots], k) and torch.equal(flat[1, slots], v)
    untouched = torch.ones(flat.shape[1], dtype=torch.bool, device=slots.device)
    untouched[slots] = False
    assert torch.equal(flat[:, untouched], before.view(2, -1, 2, 32)[:, untouched])
    check(case, layer=1)


def test_registry_name() -> None:
    assert lookup("attention", "triton") is TritonPagedAttention


GPU_LENGTHS = ([3000, 1, 517, 2048, 70, 1200], [1, 1, 517, 300, 1, 1])   # decode, prompt, chunk


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h,h_kv,d", [(32, 8, 128), (16, 8, 128), (8, 8, 64), (32, 1, 128),
                                      (12, 4, 80), (8, 2, 256)])
def test_gpu_real_shapes(dtype, h, h_kv, d) -> None:
    check(make_case(h, h_kv, d, 16, *GPU_LENGTHS, dtype, seed=h * d))


@pytest.mark.gpu
@pytest.mark.parametrize("bs,window,cap", [(64, 256, 30.0), (32, None, 50.0), (16, 1000, None)])
def test_gpu_block_sizes_window_softcap(bs, window, cap) -> None:
    check(make_case(32, 8, 128, bs, *GPU_LENGTHS, torch.bfloat16, seed=bs), window, cap)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_long_context_split_decode(dtype) -> None:
    """Few sequences with long contexts take the split-KV path under the default config."""
    case = make_case(32, 8, 128, 16, [16384, 9000], [1, 1], dtype, seed=3)
    fast = TritonPagedAttention(case.cache, 32, 128)
    fast.plan(case.layout)
    assert fast.schedule is not None and fast.schedule.num_splits > 1
    check(case)


@pytest.mark.gpu
def test_warm_up_compiles_the_split_decode_tile() -> None:
    """A long-context decode batch (b16 c4096: 5 splits, 640 programs) launches decode_many in
    split mode, which no warm-up step reaches; warm_up compiles it, so the step compiles
    nothing. The tile here (5 stages) is used by no other test, so its compile must come from
    warm_up, not from an earlier test's launch in this process."""
    from dataclasses import replace

    from toolkit.attention.tuning import default_config
    from toolkit.testing import triton_compiles

    case = make_case(32, 8, 128, 16, [4096] * 16, [1] * 16, torch.bfloat16, seed=5)
    base = default_config(torch.bfloat16, 128, 4, case.cache.device)
    cfg = replace(base, decode_many=replace(base.decode_many, num_stages=5))
    fast = TritonPagedAttention(case.cache, 32, 128, config=cfg)
    with triton_compiles() as warm:
        fast.warm_up(torch.bfloat16)
    assert "_paged_attention_kernel" in warm
    fast.plan(case.layout)
    assert fast.schedule.split and len(fast.schedule.decode) * 8 >= cfg.many_programs
    with triton_compiles() as seen:
        fast.run(0, case.q)
    assert not seen, f"compiled inside the step: {seen}"
    check(case, config=cfg)
