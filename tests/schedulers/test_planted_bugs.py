"""Issue 54 item 11: direct tests for one-line bugs a mutation audit planted that the suite
let through (or caught only after minutes of hypothesis shrinking). Each fails on its bug."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.blocks.host_tier import HostTier
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.blocks.radix import RadixAllocator
from toolkit.schedulers import SJF, VTC, ContinuousBatchingScheduler, Priority
from toolkit.schedulers.kv_cache_manager import KVCacheManager
from toolkit.schedulers.policies import FCFS
from toolkit.simulator.cost import FEATURES, step_features
from toolkit.types import Request, SamplingParams, ScheduledRequest, SchedulerOutput

BS = 4


def _req(rid: str, prompt: list[int], t: float = 0.0, **kw) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=8, ignore_eos=True), arrival_time=t, **kw)


def _computed(kv: KVCacheManager, req: Request) -> None:
    """req admitted with its whole prompt computed and published."""
    hits = kv.computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens, hits=hits)
    req.num_computed_tokens = req.num_tokens
    kv.publish(req)


@pytest.mark.parametrize("cls", [PrefixCachingAllocator, RadixAllocator])
def test_release_frees_prefix_hits_tail_first(cls):
    """Hits given back are freed tail first, so the chain's tail is evicted first and its
    head stays reachable (head first: the root goes, and the rest can never be hit)."""
    alloc = cls(6, BS)
    kv = KVCacheManager(alloc, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(10, 23))                  # 3 full blocks + 1 token
    a = _req("a", prompt)
    _computed(kv, a)
    kv.free(a)
    kv.forget("a")
    b = _req("b", prompt)
    hits = kv.computed_blocks(b)
    assert len(hits) == 3
    kv.release(hits)                              # not taken: back in eviction order
    taken = alloc.allocate(alloc.num_free_blocks() - 2)   # evicts all but two cached blocks
    c = _req("c", prompt)
    assert len(kv.computed_blocks(c)) == 2, "the head of the chain was evicted before its tail"
    alloc.free(taken)


@pytest.mark.parametrize("policy", [FCFS(), Priority(), SJF("prompt"), VTC()], ids=lambda p: p.name)
def test_victim_ties_pick_the_latest_inserted(policy):
    """Equal keys (a simulator burst: equal arrival times): the documented victim is the
    latest inserted candidate."""
    reqs = [_req(f"r{i}", [1, 2, 3], t=5.0, client_id="c") for i in range(4)]
    for r in reqs:
        policy.on_add(r)
    assert policy.victim(reqs) is reqs[-1]
    assert policy.victim(reqs[:2]) is reqs[1]


def test_victim_ties_in_a_scheduler_burst():
    # 4 blocks: three 1-block prompts, then r0's growth takes the last free block and r1's
    # must preempt one of [r1, r2] (equal arrival): the latest inserted, r2
    s = ContinuousBatchingScheduler(PrefixCachingAllocator(4, BS), block_size=BS, max_num_seqs=4,
                                    max_num_batched_tokens=64, enable_prefix_caching=False)
    for i in range(3):
        s.add_request(_req(f"r{i}", [10 * i + j for j in range(1, 5)], t=1.0))
    out = s.schedule()                            # 3 prompts of one block each + their growth
    s.update(out, {x.request_id: [7] for x in out.scheduled})
    preempted = []
    for _ in range(6):
        out = s.schedule()
        preempted += out.preempted_ids
        s.update(out, {x.request_id: [7] for x in out.scheduled if x.samples})
        if preempted:
            break
    assert preempted[:1] == ["r2"]


def test_sjf_by_output_subtracts_the_tokens_produced():
    p = SJF("output")
    nearly_done = _req("a", [1, 2], expected_output_len=10)
    nearly_done.output_token_ids.extend([5] * 8)               # 2 left
    fresh = _req("b", [1, 2], t=-1.0, expected_output_len=5)   # 5 left, arrived earlier
    assert p.sort_key(nearly_done) < p.sort_key(fresh)
    nearly_done.output_token_ids.extend([5] * 5)               # past its expectation: 0, never negative
    assert p.sort_key(nearly_done)[0] == 0


@pytest.mark.parametrize("order", [[4, 2, 1, 1], [1, 4, 1, 2], [1, 1, 2, 4]])
def test_top_p_at_the_exact_boundary_keeps_the_smallest_set(order):
    """probs [.5, .25, .125, .125] with top_p = 0.75: exactly the two most likely stay
    (the mass reaches p exactly there), in the reference twin and in the fast path."""
    from toolkit.samplers import ReferenceSampler, Sampler, SamplingMetadata

    # float64 logits: the reference's mass reaches 0.75 exactly at the second token (float32
    # ones round ln 2 first, and the twin's float64 sums then pass 0.75 by 1e-8 either way);
    # the fast path's float32 exp(l - max) is exact on them: 1, 0.5, 0.25, 0.25
    exact = torch.tensor([[math.log(v) for v in order]], dtype=torch.float64)
    logits = exact.float()
    keep = sorted(range(4), key=lambda i: -order[i])[:2]
    meta = SamplingMetadata.build([SamplingParams(top_p=0.75)], [[1]], [[]], 4, "cpu")
    ref = ReferenceSampler().probs(exact, meta)[0]
    assert sorted(torch.nonzero(ref).flatten().tolist()) == sorted(keep)
    fast = Sampler().process(logits, meta)[0]
    assert sorted(torch.nonzero(torch.isfinite(fast)).flatten().tolist()) == sorted(keep)
    d = 400
    many = SamplingMetadata.build([SamplingParams(top_p=0.75, seed=i) for i in range(d)], [[1]] * d,
                                  [[]] * d, 4, "cpu")
    tokens = Sampler()(logits.expand(d, 4).contiguous(), many).token_ids
    assert set(tokens.tolist()) == set(keep)


def test_cost_features_of_a_constructed_step():
    """One decode after a 40-token prompt reads 41 KV tokens; a 40-token prompt chunk is 40
    prefill tokens, one chunk, 40 * 41 / 2 causal pairs."""
    a = _req("a", list(range(1, 41)))
    a.output_token_ids.append(7)                  # its prompt computed, one token sampled
    b = _req("b", list(range(1, 41)))
    out = SchedulerOutput(scheduled=[ScheduledRequest(a, 40, 1, [0] * 11, 0),
                                     ScheduledRequest(b, 0, 40, [1] * 10, 0)])
    f = dict(zip(FEATURES, step_features(out).tolist()))
    assert f["decode_seqs"] == 1 and f["decode_kv_tokens"] == 41
    assert f["prefill_tokens"] == 40 and f["prefill_seqs"] == 1
    assert f["prefill_attn_ktokens"] == pytest.approx(40 * 41 / 2 / 1000)
    assert f["mixed_ktokens"] == pytest.approx(40 * 1 / 1000) and f["const"] == 1


def test_the_radix_walk_stops_at_the_tokens_and_hashes_it_is_given():
    alloc = RadixAllocator(8, BS)
    kv = KVCacheManager(alloc, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(10, 23))                  # 3 full blocks cached
    a = _req("a", prompt)
    _computed(kv, a)
    hashes = kv._lookup_hashes(a)
    assert alloc.peek(hashes, tokens=prompt) == 3
    assert alloc.peek(hashes[:2], tokens=prompt) == 2        # fewer hashes: fewer blocks
    assert alloc.peek(hashes, tokens=prompt[:8]) == 2        # fewer tokens: fewer blocks
    assert alloc.peek(hashes, tokens=prompt[:10]) == 2       # a partial block never matches
    got = alloc.lookup(hashes, tokens=prompt[:8])
    assert len(got) == 2
    alloc.free(list(reversed(got)))


def test_swap_in_copies_only_the_slots_after_the_device_hits():
    """A swapped-out request comes back: what the device cache still holds is a hit, and
    only its host slots after those blocks are copied back, into the blocks after them."""
    alloc = PrefixCachingAllocator(8, BS)
    kv = KVCacheManager(alloc, block_size=BS, enable_prefix_caching=True, host_tier=HostTier(6))
    a = _req("a", list(range(10, 22)))            # 3 full blocks
    out = SchedulerOutput()
    kv.begin_step(out)
    _computed(kv, a)
    assert kv.swap_out(a, out)
    slots = kv._swapped["a"][0]
    kv.end_step()
    out = SchedulerOutput()
    kv.begin_step(out)
    hits = kv.admission_hits(a)
    assert len(hits.blocks) == 2                  # never the block of the last token
    assert kv.allocate_slots(a, a.num_tokens, hits=hits, out=out)
    kv.end_step()
    assert a.block_ids[:2] == hits.blocks and len(a.block_ids) == 3
    assert out.blocks_to_swap_in == [(slots[2], a.block_ids[2])]
