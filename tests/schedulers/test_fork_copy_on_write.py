"""n > 1 on the scheduler alone: siblings forked onto their parent's prompt blocks, copy-on-write
of shared blocks. A fake KV cache records which token each slot holds; every step applies the
planned copies, writes the scheduled positions, and checks that every request reads its own
tokens at every position it has computed. Preemption (small caches), chunked prefill, prefix
caching on and off, and finishing in any order must neither corrupt a shared block nor leak one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.blocks.free_list import FreeListAllocator
from toolkit.blocks.prefix_caching import PrefixCachingAllocator
from toolkit.schedulers import ContinuousBatchingScheduler
from toolkit.schedulers.simulate import fake_token
from toolkit.types import Request, RequestStatus, SamplingParams


@settings(max_examples=40, deadline=None)
@given(block_size=st.sampled_from([2, 4, 5]), num_blocks=st.integers(12, 40),
       groups=st.lists(st.tuples(st.integers(1, 17), st.integers(1, 4), st.integers(1, 9)),
                       min_size=1, max_size=4),
       prefix=st.booleans(), budget=st.sampled_from([6, 64]))
def test_forked_siblings_read_their_own_tokens(block_size, num_blocks, groups, prefix, budget) -> None:
    alloc = (PrefixCachingAllocator if prefix else FreeListAllocator)(num_blocks, block_size)
    s = ContinuousBatchingScheduler(alloc, block_size=block_size, max_num_batched_tokens=budget,
                                    enable_prefix_caching=prefix)
    held: list[tuple[Request, Request]] = []
    for g, (plen, n, max_tokens) in enumerate(groups):
        prompt = [(g * 31 + i) % 97 for i in range(plen)]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        lead = Request(f"{g}.0", prompt, params)
        s.add_request(lead)
        held += [(Request(f"{g}.{j}", prompt, params), lead) for j in range(1, n)]
    kv: dict[tuple[int, int], int] = {}                    # (block, slot) -> token written there
    forks = copies = 0
    for _ in range(400):
        still = []
        for r, lead in held:                               # the engine's _release_held
            if lead.is_finished or lead.num_computed_tokens >= lead.num_prompt_tokens - 1:
                if not (not lead.is_finished and s.fork(r, lead)):
                    s.add_request(r)
                else:
                    forks += 1
            else:
                still.append((r, lead))
        held = still
        if not s.has_unfinished() and not held:
            break
        out = s.schedule()
        for src, dst in out.blocks_to_copy:                # the runner's copy_blocks
            copies += 1
            for slot in range(block_size):
                if (src, slot) in kv:
                    kv[(dst, slot)] = kv[(src, slot)]
                else:
                    kv.pop((dst, slot), None)
        for x in out.scheduled:                            # the forward's write_kv ...
            toks = x.request.all_token_ids
            for pos in range(x.start, x.start + x.num_new_tokens):
                if pos < len(toks):
                    kv[(x.block_ids[pos // block_size], pos % block_size)] = toks[pos]
        for x in out.scheduled:                            # ... then attention reads them all
            toks = x.request.all_token_ids
            for pos in range(min(x.start + x.num_new_tokens, len(toks))):
                got = kv.get((x.block_ids[pos // block_size], pos % block_size))
                assert got == toks[pos], (x.request_id, pos, got, toks[pos])
        sampled = {x.request_id: [fake_token(x.request_id, x.request.num_tokens, 97)]
                   for x in out.scheduled if x.samples}
        s.update(out, sampled)
    assert not held and not s.has_unfinished()
    assert alloc.num_free_blocks() == num_blocks
    assert all(alloc.ref_count(b) == 0 for b in range(num_blocks))
    # with an ample cache every sibling is forked, and a shared partial block is copied
    if num_blocks >= 40 and budget == 64 and any(n > 1 and p % block_size for p, n, _ in groups):
        assert forks and copies


def test_fork_refuses_what_it_cannot_share() -> None:
    alloc = FreeListAllocator(16, 4)
    s = ContinuousBatchingScheduler(alloc, block_size=4, max_num_seqs=2)
    lead = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    s.add_request(lead)
    sib = Request("b", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    assert not s.fork(sib, lead)                           # prompt not computed yet
    out = s.schedule()
    s.update(out, {"a": [9]})
    assert not s.fork(Request("c", [1, 2, 3], SamplingParams()), lead)   # another prompt
    assert s.fork(sib, lead) and sib.status is RequestStatus.RUNNING
    assert sib.block_ids == lead.block_ids[:2] and sib.num_computed_tokens == 5
    assert [alloc.ref_count(b) for b in lead.block_ids[:2]] == [2, 2]
    assert not s.fork(Request("d", [1, 2, 3, 4, 5, 6], SamplingParams()), lead)   # batch full
    shared = lead.block_ids[1]
    out = s.schedule()              # both write into block 1: the first copies, the other writes in place
    assert [src for src, _ in out.blocks_to_copy] == [shared]
    (_, dst), = out.blocks_to_copy
    assert sorted([lead.block_ids[1], sib.block_ids[1]]) == sorted([shared, dst])
    assert alloc.ref_count(shared) == 1 and alloc.ref_count(dst) == 1
    assert alloc.ref_count(lead.block_ids[0]) == 2                   # the full block stays shared
