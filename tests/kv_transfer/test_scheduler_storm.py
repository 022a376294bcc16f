"""ConnectorScheduler's bookkeeping under a scripted connector, without a model: loads that
take 0-3 steps (asynchronous or not) and sometimes fail, saves that hold blocks 0-3 steps,
shared prefixes, preemptions, and aborts of running, waiting, loading and arrived requests.
After every step each block's reference count equals the requests (and held transfers)
that hold it; at the end every request that was not aborted has all its tokens (the fake
model's) and every block is free."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from toolkit.blocks.reference import ReferenceAllocator
from toolkit.kv_transfer.base import KVConnectorBase, KVConnectorMetadata, KVConnectorOutput
from toolkit.kv_transfer.scheduler import ConnectorScheduler
from toolkit.schedulers.simulate import fake_token
from toolkit.types import Request, RequestStatus, SamplingParams, StepResult

BS, VOCAB = 4, 97


class ScriptedConnector(KVConnectorBase):
    def __init__(self, rng: random.Random, fail_p: float) -> None:
        super().__init__()
        self.rng, self.fail_p = rng, fail_p
        self.saved: set[tuple[int, ...]] = set()         # block-aligned token prefixes it holds
        self.loads: dict[str, list] = {}                  # rid -> [steps left, fails, blocks]
        self.saves: dict[str, int] = {}                   # rid -> steps left
        self.num_async = self.num_sync = self.num_failed = 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        toks = request.all_token_ids
        k = (request.num_tokens - 1) // BS
        while k * BS > num_computed_tokens and tuple(toks[:k * BS]) not in self.saved:
            k -= 1
        n = max(0, k * BS - num_computed_tokens)
        self.first = num_computed_tokens // BS
        return n, bool(n) and self.rng.random() < 0.7

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        if request.status is RequestStatus.WAITING_FOR_REMOTE_KVS or request.request_id in self.loads:
            raise AssertionError("allocated twice")
        # the scheduler parks it after this call when the load is async: decide from the match
        ext = list(block_ids[self.first:self.first + num_external_tokens // BS])   # the loaded ones only
        self.loads[request.request_id] = [self.rng.randint(0, 3), self.rng.random() < self.fail_p, ext]

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        n = min(request.num_computed_tokens // BS, len(block_ids))
        toks = request.all_token_ids
        for k in range(1, n + 1):
            self.saved.add(tuple(toks[:k * BS]))
        if n and self.rng.random() < 0.7:
            self.saves[request.request_id] = self.rng.randint(0, 3)
            return True, None
        return False, None

    def start_load_kv(self):
        pass

    def tick(self, sched) -> KVConnectorOutput:
        out = KVConnectorOutput()
        for rid, job in list(self.loads.items()):
            parked = rid in sched.remote
            gone = rid not in sched.requests and rid in sched._held
            if not (parked or gone):          # a synchronous load: done (or failed) within its step
                del self.loads[rid]
                self.num_sync += 1
                if job[1]:
                    out.invalid_block_ids.update(job[2])
                    self.num_failed += 1
                continue
            if job[0] > 0:
                job[0] -= 1
                continue
            del self.loads[rid]
            self.num_async += 1
            out.finished_recving.add(rid)
            if job[1]:
                out.invalid_block_ids.update(job[2])
                self.num_failed += 1
        for rid in list(self.saves):
            if self.saves[rid] == 0:
                del self.saves[rid]
                out.finished_sending.add(rid)
            else:
                self.saves[rid] -= 1
        return out


def _check_refs(sched) -> None:
    held = Counter()
    for r in sched.requests.values():
        held.update(r.block_ids)
    for blocks in sched._held.values():
        held.update(blocks)
    alloc = sched.allocator
    for b in range(alloc.num_blocks):
        assert alloc.ref_count(b) == held[b], (b, alloc.ref_count(b), held[b])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_storm(seed):
    rng = random.Random(seed)
    conn = ScriptedConnector(rng, fail_p=0.25)
    sched = ConnectorScheduler(ReferenceAllocator(24, BS), kv_connector=conn, block_size=BS, max_num_seqs=6,
                               max_num_batched_tokens=12, enable_prefix_caching=bool(seed % 2))
    heads = [[rng.randrange(1, VOCAB) for _ in range(12)] for _ in range(3)]
    want, got, aborted, out_len = {}, {}, set(), {}
    kinds = Counter()                                    # what the aborts hit
    for step in range(400):
        if step < 250 and rng.random() < 0.35:
            rid = f"r{step}"
            prompt = rng.choice(heads)[: rng.randint(5, 12)] + [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 6))]
            n = rng.randint(1, 8)
            sched.add_request(Request(rid, prompt, SamplingParams(max_tokens=n, ignore_eos=True)))
            want[rid] = [fake_token(rid, len(prompt) + i, VOCAB) for i in range(n)]
            got[rid] = []
        if rng.random() < 0.08 and sched.requests:
            rid = rng.choice(sorted(sched.requests))
            kinds["loading" if rid in sched.remote else "arrived" if rid in sched._arrived
                  else sched.requests[rid].status.name] += 1
            sched.abort([rid])
            aborted.add(rid)
        out = sched.schedule()
        sampled = {s.request_id: [fake_token(s.request_id, s.request.num_tokens, VOCAB)]
                   for s in out.scheduled if s.samples}
        for o in sched.update(out, StepResult(sampled, kv_connector_output=conn.tick(sched))):
            got[o.request_id] += o.new_token_ids
            if o.finished:
                out_len[o.request_id] = o.finish_reason
        _check_refs(sched)
        if step >= 250 and not sched.has_unfinished():
            break
    assert not sched.has_unfinished(), sched
    assert sched.allocator.num_free_blocks() == sched.allocator.num_blocks
    for rid, toks in want.items():
        if rid not in aborted:
            assert got[rid] == toks and out_len[rid] == "length", rid
    assert conn.num_async > 0 and conn.num_sync > 0 and conn.num_failed > 0 and sched.num_delayed_frees > 0
    assert kinds["RUNNING"] and kinds["WAITING"]
    if seed != 1:                         # (seed 1's aborts happen to miss the loading ones)
        assert kinds["loading"] and kinds["arrived"], kinds
    # a failed load recomputes its request (one aborted while loading has none to recompute)
    assert 0 < sched.num_failed_loads <= conn.num_failed
