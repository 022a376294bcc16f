"""max_loras as a scheduling constraint: at most the pool's slots' adapters run in a step, a
request whose adapter would exceed it waits while others go on, slots are held from admission
to finish / preemption (nothing leaks), and an adapter-aware policy is a few lines."""

from __future__ import annotations

import random

import pytest

from toolkit.lora.pool import AdapterPool
from toolkit.lora.request import LoRARequest
from toolkit.registry import create_part
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.policy_base import Policy
from toolkit.types import Request, SamplingParams


class AdapterAffinity(Policy):
    """Admit first the requests whose adapter is already running (fewer slot loads), then FCFS."""
    name = "adapter_affinity"

    def sort_key(self, r):
        return r.arrival_time

    def admission_key(self, r):
        running = {q.lora_request for q in self.view.running}
        return (r.lora_request not in running, r.arrival_time)


def _run(policy, num_slots: int, seed: int, num_blocks: int = 40) -> list[int]:
    rng = random.Random(seed)
    alloc = create_part("allocator", "prefix_caching", num_blocks=num_blocks, block_size=4)
    s = ContinuousBatchingScheduler(alloc, block_size=4, max_num_seqs=6, max_num_batched_tokens=32,
                                    policy=policy)
    s.lora_pool = AdapterPool(num_slots)
    adapters = [None] + [LoRARequest(f"a{i}", i, f"/a{i}") for i in range(1, 6)]
    for i in range(30):
        s.add_request(Request(str(i), [rng.randrange(100) for _ in range(rng.randint(1, 12))],
                              SamplingParams(max_tokens=rng.randint(1, 8)), arrival_time=float(i),
                              lora_request=rng.choice(adapters)))
    loads, resident, preempted = 0, {}, 0
    for _ in range(500):
        if not s.has_unfinished():
            break
        out = s.schedule()
        preempted += len(out.preempted_ids)
        step = {x.request.lora_request.lora_int_id for x in out.scheduled if x.request.lora_request}
        assert len(step) <= num_slots and set(out.lora_slots) == step
        assert len(set(out.lora_slots.values())) == len(step)
        for a, slot in out.lora_slots.items():
            assert s.lora_pool.slot_of(a) == slot and s.lora_pool.refcount(a) >= 1
            loads += resident.get(slot) != a
            resident[slot] = a
        held = {r.lora_request.lora_int_id for r in s.running if r.lora_request}
        assert len(held) <= num_slots
        s.update(out, {x.request_id: [7] for x in out.scheduled if x.samples})
    assert not s.has_unfinished() and not s._lora_held
    assert all(s.lora_pool.refcount(a) == 0 for a in range(1, 6)) and s.lora_pool.num_free_slots() == num_slots
    assert alloc.num_free_blocks() == alloc.num_blocks
    return [loads, preempted]


@pytest.mark.parametrize("num_slots", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_max_loras_per_step(num_slots, seed):
    _run("fcfs", num_slots, seed)


def test_preemption_releases_slots():
    assert _run("fcfs", 2, 3, num_blocks=12)[1] > 0     # a small cache: preemptions while adapters are held


def test_adapter_aware_policy_loads_fewer():
    fcfs = sum(_run("fcfs", 2, s)[0] for s in range(3))
    aware = sum(_run(AdapterAffinity(), 2, s)[0] for s in range(3))
    assert aware <= fcfs


def test_waiting_adapter_does_not_block_others():
    alloc = create_part("allocator", "free_list", num_blocks=20, block_size=4)
    s = ContinuousBatchingScheduler(alloc, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    s.lora_pool = AdapterPool(1)
    a, b = LoRARequest("a", 1, "/a"), LoRARequest("b", 2, "/b")
    for rid, lora in (("0", a), ("1", b), ("2", None), ("3", a)):
        s.add_request(Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), lora_request=lora))
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == ["0", "2", "3"] and out.lora_slots == {1: 0}


def test_config_checks():
    from toolkit.config import EngineConfig

    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(TypeError, match="max_lora_rank"):
        EngineConfig(enable_lora=True, max_lora_rank=8.0)
    with pytest.raises(ValueError, match="max_loras"):
        EngineConfig(enable_lora=True, max_loras=0)
    EngineConfig(enable_lora=True, tensor_parallel_size=2)      # each rank loads its slices


def test_engine_needs_a_lora_scheduler_and_a_native_model():
    from transformers import LlamaConfig

    from toolkit import LLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    with pytest.raises(ValueError, match="supports_lora"):
        LLM(cfg, enable_lora=True, scheduler="static", num_blocks=8)
    with pytest.raises(ValueError, match="native model"):
        LLM(cfg, enable_lora=True, model_impl="transformers", num_blocks=8)
