"""ConnectorScheduler keeps the continuous scheduler's behaviour: the public scheduler
conformance machine (arrivals, aborts, chunking, prefix hits, preemption, drafts) with a
connector that matches nothing and saves nothing; and its own errors."""

from __future__ import annotations

import pytest

from toolkit.blocks.reference import ReferenceAllocator
from toolkit.kv_transfer.base import KVConnectorBase, KVConnectorMetadata
from toolkit.kv_transfer.scheduler import ConnectorScheduler
from toolkit.testing import check_scheduler
from toolkit.types import Request, RequestFault, SamplingParams


class NullConnector(KVConnectorBase):
    def __init__(self, matched: int = 0) -> None:
        super().__init__()
        self.matched, self.asked = matched, 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.asked += 1
        return self.matched, False

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def start_load_kv(self):
        pass


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "no-prefix"])
def test_conformance_with_a_connector_that_matches_nothing(prefix):
    conns = []

    def factory(alloc, bs, seqs, budget):
        conns.append(NullConnector())
        return ConnectorScheduler(alloc, kv_connector=conns[-1], block_size=bs, max_num_seqs=seqs,
                                  max_num_batched_tokens=budget, enable_prefix_caching=prefix)

    check_scheduler(factory)
    assert sum(c.asked for c in conns) > 0


def test_a_connector_that_overclaims_is_refused():
    s = ConnectorScheduler(ReferenceAllocator(16, 4), kv_connector=NullConnector(matched=99), block_size=4)
    s.add_request(Request("r", list(range(1, 10)), SamplingParams(max_tokens=2)))
    with pytest.raises(RequestFault, match="matched 99 tokens") as e:    # the engine ends that request alone
        s.schedule()
    assert e.value.request_ids == ["r"]
    assert s.allocator.num_free_blocks() == 16
    with pytest.raises(TypeError, match="lacks"):
        ConnectorScheduler(ReferenceAllocator(16, 4), kv_connector=object(), block_size=4)


class _OneLoad(NullConnector):
    """Request "a" can load its first 16 tokens, asynchronously; nothing else matches."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if request.request_id == "a" and not self.asked:
            self.asked += 1
            return 16 - num_computed_tokens, True
        return 0, False


def test_loaded_requests_give_their_blocks_back_when_the_queue_is_stuck():
    """A loaded request behind a queue head that cannot fit while it holds its blocks, with
    nothing running: without giving them back, no step would ever schedule anything."""
    from toolkit.kv_transfer.base import KVConnectorOutput
    from toolkit.schedulers.simulate import fake_token
    from toolkit.types import StepResult

    s = ConnectorScheduler(ReferenceAllocator(6, 4), kv_connector=_OneLoad(), block_size=4,
                           max_num_batched_tokens=64)
    s.add_request(Request("a", list(range(1, 18)), SamplingParams(max_tokens=2, ignore_eos=True), arrival_time=1.0))
    out = s.schedule()
    assert "a" in s.remote and not out.scheduled
    s.add_request(Request("b", list(range(30, 42)), SamplingParams(max_tokens=4, ignore_eos=True), arrival_time=0.0))
    s.update(out, StepResult(kv_connector_output=KVConnectorOutput(finished_recving={"a"})))
    done = {}
    for _ in range(40):
        out = s.schedule()
        sampled = {x.request_id: [fake_token(x.request_id, x.request.num_tokens, 97)] for x in out.scheduled if x.samples}
        done.update({o.request_id: o.finish_reason for o in s.update(out, StepResult(sampled)) if o.finished})
        if not s.has_unfinished():
            break
    assert done == {"a": "length", "b": "length"}
    assert s.allocator.num_free_blocks() == 6
