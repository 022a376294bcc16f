"""The scheduling policies: each passes the conformance suite, and each decides what its
rule says (order, admission, victims), on small hand-made cases."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import settings as Settings

from toolkit.blocks.reference import ReferenceAllocator
from toolkit.entrypoints.request_fields import per_prompt_fields
from toolkit.schedulers import EDF, LPM, SJF, VTC, ContinuousBatchingScheduler, Policy, Priority
from toolkit.schedulers.policies import policy_of, resolve_policy, warn_ignored_priority
from toolkit.testing import check_scheduler
from toolkit.types import Request, SamplingParams


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Filled(ContinuousBatchingScheduler):
    """Gives the conformance suite's requests the fields the policies need (a client of
    three, a deadline of 1-4 s, the expected output = max_tokens)."""

    def add_request(self, r: Request) -> None:
        k = int(r.request_id[1:]) if r.request_id[1:].isdigit() else 0
        r.client_id = r.client_id or f"c{k % 3}"
        r.deadline = r.deadline or 1.0 + k % 4
        if r.expected_output_len is None:
            r.expected_output_len = r.sampling_params.max_tokens
        super().add_request(r)


POLICY_CASES = {      # fcfs and priority without aging: test_scheduler_conformance.py
    "priority_aging": lambda: Priority(aging=0.5),
    "sjf_prompt": lambda: SJF("prompt"),
    "sjf_output": lambda: SJF("output"),
    "lpm": lambda: LPM(),
    "vtc": lambda: VTC(),
    "edf_defer_all": lambda: EDF(tpot=1.0),                # the monotonic clock: every deadline missed
    "edf_admit": lambda: EDF(tpot=1e-3),
}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
def test_policy_passes_check_scheduler(case: str) -> None:
    clock = Clock(0.0) if case == "edf_admit" else None
    check_scheduler(lambda a, bs, seqs, budget: Filled(
        a, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=budget,
        policy=POLICY_CASES[case](), clock=clock),
        settings=Settings(max_examples=15, stateful_step_count=30, deadline=None, derandomize=True))


# -- hand-made cases --
def make(policy, num_blocks: int = 32, block_size: int = 4, clock=None, **kw) -> ContinuousBatchingScheduler:
    return ContinuousBatchingScheduler(ReferenceAllocator(num_blocks, block_size), block_size=block_size,
                                       policy=policy, clock=clock, **kw)


def req(rid: str, n: int = 4, max_tokens: int = 4, t: float = 0.0, prompt=None, **kw) -> Request:
    return Request(rid, prompt or list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=t, **kw)


def admitted(s: ContinuousBatchingScheduler) -> list[str]:
    out = s.schedule()
    s.update(out, {x.request_id: [7] for x in out.scheduled if x.samples})
    return [x.request_id for x in out.scheduled]


def test_priority_aging_lets_an_old_low_priority_request_overtake() -> None:
    clock = Clock(10.0)
    s = make(Priority(aging=1.0), max_num_seqs=1, clock=clock)
    s.add_request(req("old_low", t=0.0, priority=5))     # effective 5 - 10 = -5
    s.add_request(req("new_high", t=10.0, priority=0))   # effective 0
    assert admitted(s) == ["old_low"]
    s2 = make(Priority(), max_num_seqs=1, clock=Clock(10.0))
    s2.add_request(req("old_low", t=0.0, priority=5))
    s2.add_request(req("new_high", t=10.0, priority=0))
    assert admitted(s2) == ["new_high"]


def test_sjf_by_prompt_and_by_expected_output() -> None:
    s = make(SJF("prompt"), max_num_seqs=1)
    s.add_request(req("long", n=9, t=0))
    s.add_request(req("short", n=2, t=1))
    assert admitted(s) == ["short"]
    s = make(SJF("output"), max_num_seqs=1)
    s.add_request(req("long_out", n=2, t=0, expected_output_len=50))
    s.add_request(req("short_out", n=9, t=1, expected_output_len=3))
    assert admitted(s) == ["short_out"]


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    s = make(LPM(), max_num_seqs=1)
    shared = list(range(100, 116))            # 4 full blocks
    s.add_request(req("warm", prompt=shared + [1], max_tokens=1))
    while s.has_unfinished():
        admitted(s)
    s.add_request(req("cold", prompt=list(range(200, 217)), t=1))
    s.add_request(req("hit", prompt=shared + [2], t=2))
    assert s.policy.view.kv.num_cached_tokens(s.waiting[1]) == 16
    assert admitted(s) == ["hit"]
    fcfs = make("fcfs", max_num_seqs=1)
    fcfs.add_request(req("cold", prompt=list(range(200, 217)), t=1))
    fcfs.add_request(req("hit", prompt=shared + [2], t=2))
    assert admitted(fcfs) == ["cold"]


def test_vtc_serves_the_least_served_client_and_lifts_a_returning_one() -> None:
    s = make(VTC(), max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(3):                    # distinct prompts: no prefix hit lowers a charge
        s.add_request(req(f"a{i}", prompt=[10 * i + j for j in range(1, 9)], t=i, client_id="a", max_tokens=1))
    s.add_request(req("b0", prompt=list(range(50, 58)), t=10, client_id="b", max_tokens=1))
    order = []
    while s.has_unfinished():
        order += admitted(s)
    # a0 first (arrival), then b0: b's counter (0) is below a's (8) although a1 came earlier
    assert order[:2] == ["a0", "b0"]
    v = s.policy
    assert v.counters["a"] == 3 * 8 and v.counters["b"] == 8
    s.add_request(req("c0", n=4, t=20, client_id="c", max_tokens=1))   # c was never active: lifted
    s.add_request(req("a3", n=4, t=20, client_id="a", max_tokens=1))
    assert v.counters["c"] == 0            # no active client when c arrived
    s.add_request(req("d0", n=4, t=21, client_id="d", max_tokens=1))
    assert v.counters["d"] == min(v.counters["c"], v.counters["a"])   # lifted to the active minimum


def test_vtc_charges_decode_tokens_at_the_output_weight() -> None:
    s = make(VTC(input_weight=1.0, output_weight=3.0), max_num_batched_tokens=64)
    s.add_request(req("x", n=5, client_id="x", max_tokens=3))
    while s.has_unfinished():
        admitted(s)
    assert s.policy.counters["x"] == 5 * 1 + 2 * 3     # prompt, then 2 decode steps (the 1st token is the prefill's)


def test_edf_orders_by_deadline_and_defers_or_rejects_what_cannot_make_it() -> None:
    clock = Clock(0.0)
    s = make(EDF(tpot=0.1, prefill_tokens_per_s=1000.0), max_num_seqs=1, clock=clock)
    s.add_request(req("late", t=0.0, deadline=9.0))
    s.add_request(req("soon", t=0.5, deadline=2.0))
    assert admitted(s) == ["soon"]
    clock.t = 100.0        # both hopeless now; deferred ones are still served (best effort)
    s2 = make(EDF(tpot=0.1), max_num_seqs=2, clock=clock)
    s2.add_request(req("hopeless", t=0.0, deadline=1.0))
    s2.add_request(req("fine", t=99.0, deadline=30.0))
    assert admitted(s2) == ["fine", "hopeless"]
    s3 = make(EDF(tpot=0.1, on_miss="reject"), clock=clock)
    s3.add_request(req("hopeless", t=0.0, deadline=1.0))
    s3.add_request(req("fine", t=99.0, deadline=30.0))
    out = s3.schedule()
    assert [x.request_id for x in out.scheduled] == ["fine"]
    reports = s3.update(out, {"fine": [7]})
    assert [(o.request_id, o.finish_reason) for o in reports if o.finished] == [("hopeless", "rejected")]
    assert s3.schedule().finished_ids == ["hopeless"]
    assert s3.allocator.num_free_blocks() == 32 - len(s3.requests["fine"].block_ids)


def test_a_policy_that_needs_a_field_names_it_and_queues_nothing() -> None:
    for policy, field in ((SJF("output"), "expected_output_len"),):
        s = make(policy)
        with pytest.raises(ValueError, match=f"needs request.{field}"):
            s.add_request(req("x"))
        assert not s.has_unfinished()


def test_vtc_and_edf_default_a_missing_client_or_deadline() -> None:
    """Issue 54: VTC refused requests without client_id (a server then refused every client
    that sent no `user`), EDF those without a deadline."""
    v = make(VTC(), max_num_seqs=1, max_num_batched_tokens=64)
    v.add_request(req("anon0", prompt=list(range(1, 9)), t=0, max_tokens=1))
    v.add_request(req("anon1", prompt=list(range(11, 19)), t=1, max_tokens=1))
    v.add_request(req("b0", prompt=list(range(21, 29)), t=2, client_id="b", max_tokens=1))
    order = []
    while v.has_unfinished():
        order += admitted(v)
    assert order == ["anon0", "b0", "anon1"]          # the anonymous ones share one counter
    assert v.policy.counters[None] == 16 and v.policy.counters["b"] == 8
    e = make(EDF(tpot=0.1, prefill_tokens_per_s=1000.0), max_num_seqs=1, clock=Clock(0.0))
    e.add_request(req("none0", t=0.0, max_tokens=1))
    e.add_request(req("due", t=1.0, deadline=50.0, max_tokens=1))
    e.add_request(req("none1", t=0.5, max_tokens=1))
    order = []
    while e.has_unfinished():
        order += admitted(e)
    assert order == ["due", "none0", "none1"]         # deadlined first, then FCFS


def test_vtc_forgets_idle_clients_past_its_bound() -> None:
    """Issue 54: VTC kept a counter per client forever, and scanned them all at each add."""
    s = make(VTC(max_idle_clients=8), num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    s.add_request(req("stay", prompt=[1, 2], t=0, client_id="stay", max_tokens=150))
    for i in range(100):
        s.add_request(req(f"c{i}", prompt=[i % 50 + 1, 7], t=1 + i, client_id=f"c{i}", max_tokens=1))
        while f"c{i}" in s.requests:
            admitted(s)
        assert len(s.policy.counters) <= 1 + 8 and "stay" in s.policy.counters
    assert list(s.policy._live) == ["stay"]


def test_admit_must_answer_a_valid_verdict() -> None:
    class Bad(Policy):
        def sort_key(self, r):
            return (r.arrival_time,)

        def admit(self, r):
            return "maybe"

    s = make(Bad())
    s.add_request(req("x"))
    with pytest.raises(ValueError, match="admit returned 'maybe'"):
        s.schedule()


def test_policy_view_is_read_only_and_knows_the_cache() -> None:
    s = make("fcfs", clock=Clock(3.0))
    view = s.policy.view
    s.schedule()
    assert view.now() == 3.0 and view.kv.num_free_blocks() == 32 and view.running == ()
    assert not hasattr(view.kv, "allocate_slots") and not hasattr(view, "schedule")


def test_duck_typed_policy_is_adapted_and_rebinding_resets_state() -> None:
    class Mine:
        def sort_key(self, r):
            return (-r.num_prompt_tokens,)

        def victim(self, running):
            return running[-1]

    p = resolve_policy(Mine())
    assert p.sort_key(req("a", n=3)) == (-3,)
    v = VTC()
    make(v).add_request(req("a", client_id="a"))
    assert v._live["a"] == 1
    b = make(v)                           # bound to a new scheduler: fresh counters
    assert not v._live and not v.counters and v.view is b.policy.view
    a = make(v, clock=Clock(7.0))
    b.schedule()                          # b takes it back (a simulation used it meanwhile)
    assert v.view is b._view and v.view is not a._view


def test_priority_warning_and_per_prompt_fields() -> None:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        warn_ignored_priority(policy_of(make("fcfs")), 3)
        warn_ignored_priority(policy_of(make("priority")), 3)
        warn_ignored_priority(policy_of(make("fcfs")), 0)
    assert len(w) == 1 and "ignores priorities" in str(w[0].message)
    rows = per_prompt_fields(2, priorities=[1, 2], client_id="u", deadline=[None, 4.0])
    assert rows == [{"priority": 1, "client_id": "u"}, {"priority": 2, "client_id": "u", "deadline": 4.0}]
    with pytest.raises(ValueError, match="not both"):
        per_prompt_fields(1, priority=[1], priorities=[1])
    with pytest.raises(ValueError, match="3 values of client_id for 2 prompts"):
        per_prompt_fields(2, client_id=["a", "b", "c"])
