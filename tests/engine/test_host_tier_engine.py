"""The host tier and swap preemption in the engine (tiny model, CPU): greedy outputs equal
those of an ample device pool with the tier on, off, swap and recompute, with the prefix
cache's evictions and the preemptions actually going through the host (counters), with the
bytes of every block that left the device poisoned after its swap-out, and no device block
or host slot left held at the end."""

from __future__ import annotations

import pytest
import torch

from toolkit import LLM, SamplingParams
from toolkit.blocks.host_kv import HostKVCache

BS = 4
LONG = 16        # output tokens of the preemption runs
POISON = 1e3     # finite: a masked (p = 0) read of it stays 0, a real read changes the logits


def _shared_prompts() -> list[list[int]]:
    """6 prompts over 3 prefixes of 20 tokens (5 blocks), each asked twice, far apart."""
    pre = [[(7 * i + 3 * j) % 500 + 5 for j in range(20)] for i in range(3)]
    first = [p + [11 + k, 12 + k] for k, p in enumerate(pre)]
    return first, [p + [40 + k, 41 + k, 42 + k] for k, p in enumerate(pre)]


def _long_prompts() -> list[list[int]]:
    return [[(13 * i + j) % 500 + 5 for j in range(14 + 3 * i)] for i in range(4)]


def _poison_after_swap_out(llm: LLM) -> dict:
    """Wrap the host pool's swap_out: after the copy, every source block that the device
    prefix cache no longer holds is filled with POISON (a swapped-out preempted request's
    blocks, evicted cached blocks now reused). Counts what it poisoned."""
    host: HostKVCache = llm.engine.runner.host_kv
    alloc = llm.engine.scheduler.allocator
    layers = llm.engine.runner.kv_cache.layers
    seen = {"poisoned": 0}
    real = host.swap_out

    def swap_out(lay, pairs):
        real(lay, pairs)
        keep = alloc.cached_blocks()
        gone = [b for b, _ in pairs if b not in keep]
        for layer in layers:
            layer[:, gone] = POISON
        seen["poisoned"] += len(gone)

    host.swap_out = swap_out
    return seen


def _generate(llm: LLM, batches: list[list[list[int]]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    out = []
    for prompts in batches:
        out += [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    return out


def _no_leaks(llm: LLM) -> None:
    sched = llm.engine.scheduler
    assert sched.allocator.num_free_blocks() == sched.allocator.num_blocks
    host = sched.kv.host
    if host is not None:
        assert host.num_owned() == 0 and sched.kv.num_host_slots_held() == 0
        host.check()


@pytest.fixture(scope="module")
def ample(tiny_llama_dir):
    """Outputs with a device pool that holds everything."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=256) as llm:
        first, again = _shared_prompts()
        return {"shared": _generate(llm, [first, again], 6),
                "long": _generate(llm, [_long_prompts()], LONG)}


@pytest.mark.parametrize("allocator", ["prefix_caching", "radix"])
@pytest.mark.parametrize("tier", [True, False], ids=["tier", "no_tier"])
def test_prefix_cache_with_host_tier(tiny_llama_dir, ample, allocator, tier):
    """A 12-block device pool cannot keep 3 prefixes of 5 blocks and their requests' 7 blocks:
    the second round's prefixes were evicted. With the tier they come back from the host."""
    kw = dict(host_cache_blocks=64) if tier else {}
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=12,
             max_num_seqs=1, allocator=allocator, **kw) as llm:
        seen = _poison_after_swap_out(llm) if tier else None
        first, again = _shared_prompts()
        got = _generate(llm, [first, again], 6)
        kv = llm.engine.scheduler.kv
        if tier:
            assert kv.host.num_stored > 0 and kv.host.num_loaded >= 5, kv.host
            assert kv.num_swapped_in > 0 and seen["poisoned"] > 0
        _no_leaks(llm)
    assert got == ample["shared"]


@pytest.mark.parametrize("preemption,async_scheduling", [("swap", False), ("swap", True), ("recompute", False)],
                         ids=["swap-sync", "swap-async", "recompute"])
def test_swap_preemption_equals_recompute(tiny_llama_dir, ample, preemption, async_scheduling):
    """4 requests growing to 30-39 tokens in a 16-block pool (64 tokens): preemptions. Swap
    parks the victims' KV in the host pool (poisoned on the device after the copy)."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=16,
             max_num_batched_tokens=16, host_cache_blocks=48, preemption=preemption,
             async_scheduling=async_scheduling) as llm:
        seen = _poison_after_swap_out(llm)
        got = _generate(llm, [_long_prompts()], LONG)
        kv = llm.engine.scheduler.kv
        assert llm.engine.num_preemptions > 0
        if preemption == "swap":
            assert kv.num_swap_preemptions > 0 and kv.num_swapped_in > 0 and seen["poisoned"] > 0
        else:
            assert kv.num_swap_preemptions == 0
        _no_leaks(llm)
    assert got == ample["long"]


def test_full_host_pool_falls_back_to_recompute(tiny_llama_dir, ample):
    """A 3-slot host pool cannot hold a victim's blocks: it is recomputed, outputs the same."""
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=BS, num_blocks=16,
             max_num_batched_tokens=16, host_cache_blocks=3, preemption="swap",
             enable_prefix_caching=False) as llm:
        got = _generate(llm, [_long_prompts()], LONG)
        assert llm.engine.num_preemptions > llm.engine.scheduler.kv.num_swap_preemptions
        _no_leaks(llm)
    assert got == ample["long"]


def test_options_are_validated(tiny_llama_dir):
    with pytest.raises(ValueError, match="host tier"):
        LLM(tiny_llama_dir, device="cpu", num_blocks=16, preemption="swap")
    with pytest.raises(ValueError, match="preemption"):
        LLM(tiny_llama_dir, device="cpu", num_blocks=16, preemption="sometimes")
    with pytest.raises(ValueError, match="continuous"):
        LLM(tiny_llama_dir, device="cpu", num_blocks=16, host_cache_blocks=8, scheduler="static")
    with pytest.raises(ValueError, match="holds no KV block"):
        LLM(tiny_llama_dir, device="cpu", num_blocks=16, cpu_cache_gb=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ["prefix_caching", "radix"])
def test_gpu_tier_and_swap_outputs(tiny_llama_dir, allocator):
    """On CUDA (pinned pool, staged non_blocking copies, async scheduling on by default):
    swapped-out blocks poisoned after the copy, greedy outputs equal an ample pool's, for the
    prefix cache's evictions and for swap preemption."""
    first, again = _shared_prompts()
    with LLM(tiny_llama_dir, dtype="float32", block_size=BS, num_blocks=256, allocator=allocator) as llm:
        want_shared = _generate(llm, [first, again], 6)
        want_long = _generate(llm, [_long_prompts()], LONG)
    with LLM(tiny_llama_dir, dtype="float32", block_size=BS, num_blocks=12, max_num_seqs=1,
             allocator=allocator, host_cache_blocks=64) as llm:
        assert llm.engine.runner.host_kv.slots.is_pinned() and llm.engine.async_scheduling
        seen = _poison_after_swap_out(llm)
        assert _generate(llm, [first, again], 6) == want_shared
        assert llm.engine.scheduler.kv.host.num_loaded >= 5 and seen["poisoned"] > 0
        _no_leaks(llm)
    with LLM(tiny_llama_dir, dtype="float32", block_size=BS, num_blocks=16, max_num_batched_tokens=16,
             host_cache_blocks=48, preemption="swap", allocator=allocator) as llm:
        seen = _poison_after_swap_out(llm)
        assert _generate(llm, [_long_prompts()], LONG) == want_long
        assert llm.engine.scheduler.kv.num_swap_preemptions > 0 and seen["poisoned"] > 0
        _no_leaks(llm)
