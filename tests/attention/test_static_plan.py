"""Decode attention over fixed-capacity tables (attention/static_plan.py, what a full CUDA
graph of a decode step replays) against the reference twin: a step's schedule copied into a
bucket's tables, zero rows past it, the page list in the shared buffer, split mode always."""

from __future__ import annotations

import pytest
import torch
from attention_cases import REL_TOL, make_case, poisoned_like, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.attention.schedule import TileConfig
from toolkit.attention.torch_ref import TorchAttention
from toolkit.attention.triton_paged import TritonPagedAttention
from toolkit.attention.tuning import KernelConfig

# decode class up to 4 query tokens; splits forced at small sizes so padding, several splits
# per sequence and one-split sequences all occur
SMALL = KernelConfig(decode=TileConfig(4, 16, 4, 1), prefill=TileConfig(8, 16, 4, 1),
                     target_programs=16, min_split_tokens=16)
SIZES = [1, 2, 4, 8, 12]


def decode_lengths(max_seqs: int = 5):
    """(kv_lens, q_lens) of a decode-class step: q_len in 1..4 (drafts), kv_len >= q_len."""
    return st.lists(st.tuples(st.integers(1, 4), st.integers(0, 90)), min_size=1,
                    max_size=max_seqs).map(lambda s: ([q + k for q, k in s], [q for q, _ in s])
                                           ).filter(lambda s: sum(s[1]) <= SIZES[-1])


def static_vs_reference(case, sizes, bucket, impl, window=None, layer=0):
    h, d = case.q.shape[1], case.q.shape[2]
    fast = TritonPagedAttention(case.cache, h, d, sliding_window=window, config=SMALL, impl=impl)
    plans = fast.static_decode_plans(sizes)
    for b in plans.buckets.values():          # stale tables from an "earlier step"
        b.table.fill_(7)
    fast.plan(case.layout)
    mode = fast.use_static(plans, bucket)
    if mode is None:
        return None
    assert mode == ("split" if fast.schedule.num_splits > 1 else "direct")
    out = poisoned_like(case.q)
    fast.run_static(layer, case.q, out, plans, bucket, mode)
    ref = TorchAttention(case.cache, h, d, sliding_window=window)
    ref.plan(case.layout)
    return rel_err(out, ref.run(layer, case.q))


@settings(max_examples=12, deadline=None)
@given(lengths=decode_lengths(), window=st.one_of(st.none(), st.integers(1, 40)),
       seed=st.integers(0, 2**16), impl=st.sampled_from(["triton", "reference"]))
def test_static_tables_match_reference(lengths, window, seed, impl) -> None:
    kv_lens, q_lens = lengths
    case = make_case(4, 2, 16, 16, kv_lens, q_lens, torch.float32, seed)
    bucket = next(s for s in SIZES if s >= case.layout.num_tokens)
    err = static_vs_reference(case, SIZES, bucket, impl, window)
    assert err is not None, "a decode step within the bucket's bound did not fit its tables"
    assert err < REL_TOL[torch.float32], err


@settings(max_examples=300, deadline=None)
@given(lengths=decode_lengths(), extra=st.lists(st.integers(0, 700), min_size=5, max_size=5),
       window=st.one_of(st.none(), st.integers(1, 300)))
def test_every_bucket_holds_the_splits_its_steps_can_need(lengths, extra, window) -> None:
    """The bound of static_plan.py: a decode step of T tokens (more than the bucket before
    holds) always fits bucket T's tables, long contexts and misaligned windows included.
    Tables only: nothing is launched."""
    q_lens = lengths[1]
    kv_lens = [k + e for k, e in zip(lengths[0], extra)]
    case = make_case(4, 2, 16, 16, kv_lens, q_lens, torch.float32, seed=0, spare_blocks=0)
    fast = TritonPagedAttention(case.cache, 4, 16, sliding_window=window, config=SMALL,
                                impl="reference")
    plans = fast.static_decode_plans(SIZES)
    fast.plan(case.layout)
    bucket = next(s for s in SIZES if s >= case.layout.num_tokens)
    assert fast.use_static(plans, bucket) is not None, (bucket, fast.schedule.num_splits,
                                            plans.buckets[bucket].max_splits)


def test_a_prefill_tile_does_not_fit() -> None:
    case = make_case(4, 2, 16, 16, [30, 12], [1, 12], torch.float32, seed=0)
    fast = TritonPagedAttention(case.cache, 4, 16, config=SMALL, impl="reference")
    plans = fast.static_decode_plans([16])
    fast.plan(case.layout)
    assert len(fast.schedule.prefill) and fast.use_static(plans, 16) is None


@pytest.mark.parametrize("kv_lens,mode", [([56, 3], "split"), ([9, 3], "direct")])
def test_padding_rows_write_nothing(kv_lens, mode) -> None:
    """Rows of the output past the step's tokens keep what they held (the bucket is larger
    than the step): zero work items and zero merge rows are no-ops, in either launch shape;
    the split shape also holds a step that was not split. 56 keys: 4 splits and 11 padding
    rows, so a padding row that counted itself done would leave a counter nonzero."""
    case = make_case(4, 2, 16, 16, kv_lens, [1, 1], torch.float32, seed=2)
    fast = TritonPagedAttention(case.cache, 4, 16, config=SMALL)
    plans = fast.static_decode_plans([8])
    fast.plan(case.layout)
    assert fast.use_static(plans, 8) == mode
    if mode == "split":                      # what the counter check below relies on
        assert fast.schedule.num_splits == 4
        assert plans.buckets[8].work_cap - len(fast.schedule.decode) == 11
    ref = TorchAttention(case.cache, 4, 16)
    ref.plan(case.layout)
    expected = ref.run(0, case.q)
    for shape in [mode, "split", "split"]:       # split twice: a graph replays it
        q = torch.randn(8, 4, 16)
        q[:2] = case.q
        out = torch.full_like(q, 5.0)
        fast.run_static(0, q, out, plans, 8, shape)
        assert torch.equal(out[2:], torch.full_like(out[2:], 5.0)), shape
        assert rel_err(out[:2], expected) < REL_TOL[torch.float32], shape
        # the fused merge's counters: padding rows count nothing, the last split resets them
        assert not plans.counters.any(), (shape, plans.counters)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_lens", [[4096], [4096, 300, 17]])
def test_gpu_split_tables_replayed_in_a_graph(kv_lens) -> None:
    """The production path of a small decode batch at long context: split mode with the fused
    merge (the default config), captured in a CUDA graph and replayed; every replay matches
    the reference and leaves the done-counters zero for the next."""
    case = make_case(32, 8, 128, 16, kv_lens, [1] * len(kv_lens), torch.bfloat16, seed=4)
    fast = TritonPagedAttention(case.cache, 32, 128)
    assert fast.config.fused_merge
    plans = fast.static_decode_plans([4])
    fast.plan(case.layout)
    assert fast.use_static(plans, 4) == "split"
    q = torch.zeros(4, 32, 128, dtype=torch.bfloat16, device=case.q.device)
    q[: len(kv_lens)] = case.q
    out = torch.full_like(q, float("nan"))
    fast.run_static(0, q, out, plans, 4, "split")            # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fast.run_static(0, q, out, plans, 4, "split")
    ref = TorchAttention(case.cache, 32, 128)
    ref.plan(case.layout)
    expected = ref.run(0, case.q)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out[: len(kv_lens)], expected) < REL_TOL[torch.bfloat16]
        assert not plans.counters.any()
