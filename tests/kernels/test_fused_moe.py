"""The Triton fused-MoE kernel (toolkit/kernels/fused_moe.py) against the per-expert-loop twin:
under TRITON_INTERPRET=1 on the CPU (fp32 / fp16, small odd shapes, ragged loads, experts with
no token, top-k 1..E, poisoned workspaces), and on the GPU in bf16 at the Qwen3-30B-A3B MoE
shape, including a CUDA graph capture (the routing and the launches never sync with the host)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from moe_cases import routed

from toolkit.kernels import moe_torch, reference_moe
from toolkit.kernels.fused_moe import fused_experts, moe_align_block_size


@settings(max_examples=15)
@given(routed(), st.sampled_from([torch.float32, torch.float16]), st.sampled_from([16, 32]))
def test_fused_moe_equals_the_twin(case, dtype, block_m):
    x, w13, w2, weights, ids = case
    args = (x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids)
    t, k = ids.shape
    nan = float("nan")   # a row the kernel skips shows as NaN in the sum
    work = (torch.full((t * k, w2.shape[2]), nan, dtype=dtype), torch.full((t * k, x.shape[1]), nan, dtype=dtype))
    got = fused_experts(*args, workspace=work, block_m=block_m)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), reference_moe.fused_experts(*args).float(), rtol=tol, atol=tol)


@given(routed(max_t=20, max_e=9), st.sampled_from([1, 4, 16]))
def test_align_block_size_pads_each_expert_to_whole_blocks(case, block_m):
    _, _, _, _, ids = case
    e = 9
    sorted_ids, block_expert, num_padded = moe_align_block_size(ids, e, block_m)
    n = ids.numel()
    flat = ids.reshape(-1)
    real = int(num_padded)
    assert real % block_m == 0 and sorted_ids.numel() % block_m == 0 and real <= sorted_ids.numel()
    assert (sorted_ids[real:] == n).all()                          # past the real blocks: padding only
    live = sorted_ids[:real]
    assert sorted(live[live < n].tolist()) == list(range(n))       # every assignment exactly once
    for b in range(real // block_m):
        rows = live[b * block_m:(b + 1) * block_m]
        rows = rows[rows < n].long()
        assert rows.numel() > 0, "a real block with no assignment"
        assert (flat[rows] == block_expert[b]).all()               # one expert a block
    counts = torch.bincount(flat, minlength=e)
    assert real == int(((counts + block_m - 1) // block_m * block_m).sum())


def test_no_tokens_and_bad_workspace():
    x, w13, w2 = torch.zeros(0, 5), torch.zeros(3, 8, 5), torch.zeros(3, 5, 4)
    empty = fused_experts(x, w13, w2, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64))
    assert empty.shape == (0, 5)
    with pytest.raises(ValueError, match="workspace must be contiguous"):
        fused_experts(torch.zeros(2, 5), w13, w2, torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64),
                      workspace=(torch.zeros(4, 3), torch.zeros(4, 5)))


def test_fused_moe_default_tiles_over_several_k_steps():
    """The tiles a real layer gets (block_m chosen by the kernel: 64 past 256 assignments),
    hidden and intermediate sizes over several K steps of the tile, 40 tokens x top-8 of 16."""
    g = torch.Generator().manual_seed(0)
    t, e, d, i, k = 40, 16, 160, 96, 8
    x = torch.randn(t, d, generator=g)
    w13 = torch.randn(e, 2 * i, d, generator=g) / d ** 0.5
    w2 = torch.randn(e, d, i, generator=g) / i ** 0.5
    weights, ids = moe_torch.select_experts(torch.randn(t, e, generator=g), k, True)
    nan = float("nan")
    work = (torch.full((t * k, i), nan), torch.full((t * k, d), nan))
    got = fused_experts(x, w13, w2, weights, ids, workspace=work)
    torch.testing.assert_close(got, reference_moe.fused_experts(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


def _qwen3_30b_moe(t: int, seed: int = 0):
    """The Qwen3-30B-A3B MoE layer: 128 experts, top-8, hidden 2048, expert intermediate 768."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, d, i, k = 128, 2048, 768, 8
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    w13 = (torch.randn(e, 2 * i, d, device="cuda", generator=g) / d ** 0.5).bfloat16()
    w2 = (torch.randn(e, d, i, device="cuda", generator=g) / i ** 0.5).bfloat16()
    logits = torch.randn(t, e, device="cuda", generator=g)
    weights, ids = moe_torch.select_experts(logits, k, True)
    return x, w13, w2, weights, ids


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 7, 64, 300])
def test_fused_moe_bf16_on_the_gpu_equals_the_twin(t):
    args = _qwen3_30b_moe(t)
    got = fused_experts(*args)
    torch.testing.assert_close(got.float(), reference_moe.fused_experts(*args).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_router_and_experts_replay_in_a_cuda_graph():
    """Routing + both launches captured once, replayed on new inputs of the same shape: a host
    sync (.item(), data-dependent shapes) would fail the capture or freeze the first routing."""
    x, w13, w2, _, _ = _qwen3_30b_moe(16)
    logits = torch.randn(16, 128, device="cuda")
    static_x, static_logits = x.clone(), logits.clone()

    def step():
        weights, ids = moe_torch.select_experts(static_logits, 8, True)
        return fused_experts(static_x, w13, w2, weights, ids)

    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step()                                  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        static_x.copy_(torch.randn(16, 2048, device="cuda", generator=g).bfloat16())
        static_logits.copy_(torch.randn(16, 128, device="cuda", generator=g))
        graph.replay()
        weights, ids = reference_moe.select_experts(static_logits, 8, True)
        want = reference_moe.fused_experts(static_x, w13, w2, weights, ids)
        torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
