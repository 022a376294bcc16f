"""Conformance suite for schedulers: a hypothesis state machine of arrivals, steps and aborts.

    from toolkit.testing import check_scheduler
    check_scheduler(lambda alloc, bs, seqs, budget: MyScheduler(alloc, block_size=bs,
                    max_num_seqs=seqs, max_num_batched_tokens=budget))

A fake model samples the token at sequence index p of request r as a hash of (r, p), so a
request's tokens do not depend on batching, chunking, prefix hits or preemption. It also
keeps a fake KV cache (block, offset) -> token id written by every scheduled token, so a
wrong block table, a wrong prefix-cache hit, a stale computed count after preemption or
rejected drafts, or a re-hit block published with rejected draft tokens shows up as a
computed position whose KV holds the wrong token. With speculative=True, decoding requests
get 0-3 draft tokens each step (a correct prefix, then wrong ones); the fake model accepts
the matching prefix and samples one more token, as a rejection sampler would.

Checked after every rule: token budget and max_num_seqs; each scheduled request starts at
its num_computed_tokens, its block table covers its new tokens and its computed prefix
holds the right tokens; block ownership (request.block_ids) matches the allocator's ref
counts and free count; finished and aborted requests hold no block; outputs are exactly the
fake model's tokens with the right finish reason (stop ids and EOS beat length on the same
token; EOS / stop ids only after min_tokens). At teardown: arrivals stop and everything
finishes within a bound of steps (no starvation, no livelock), and every block is free.

Generated requests always fit the cache for their whole life (prompt + max_tokens <=
blocks * block_size), and with prompts_within_budget=True the token budget too (prompt <=
max_num_batched_tokens; otherwise prompts need chunking), except deliberately impossible ones (prompt larger than the cache, or than the request's
max_model_len), which must finish as "rejected" (FINISHED_IGNORED) in the next step.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from toolkit.blocks.reference import ReferenceAllocator
from toolkit.schedulers.simulate import fake_token
from toolkit.types import Request, RequestOutput, RequestStatus, SamplingParams, SchedulerOutput, StepResult

SchedulerFactory = Callable[[Any, int, int, int], Any]   # (allocator, block_size, max_num_seqs, budget)
AllocatorFactory = Callable[[int, int], Any]             # (num_blocks, block_size)

VOCAB = 16


def expected_output(req: Request) -> tuple[list[int], str, int | None]:
    """The tokens, finish reason and stop reason the fake model dictates for `req`."""
    sp, p = req.sampling_params, req.num_prompt_tokens
    max_len = req.max_model_len if req.max_model_len is not None else p + sp.max_tokens
    toks: list[int] = []
    while True:
        t = fake_token(req.request_id, p + len(toks), VOCAB)
        toks.append(t)
        if len(toks) >= sp.min_tokens:
            if not sp.ignore_eos and t == req.eos_token_id:
                return toks, "stop", None
            if sp.stop_token_ids and t in sp.stop_token_ids:
                return toks, "stop", t
        if len(toks) >= sp.max_tokens or p + len(toks) >= max_len:
            return toks, "length", None


class SchedulerMachine(RuleBasedStateMachine):
    """Set `factory` (and optionally `allocator_factory`, `speculative`) in a subclass, or use
    `scheduler_machine(...)`."""

    factory: SchedulerFactory | None = None
    allocator_factory: AllocatorFactory = staticmethod(
        lambda n, bs: ReferenceAllocator(n, bs, prefix_caching=True))
    speculative: bool = True
    max_requests: int = 12
    prompts_within_budget: bool = False   # True for schedulers that cannot chunk a prompt

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(3, 10),
                max_num_seqs=st.integers(1, 6), budget=st.integers(2, 16), burst=st.integers(0, 6),
                data=st.data())
    def setup(self, block_size: int, num_blocks: int, max_num_seqs: int, budget: int, burst: int,
              data: st.DataObject) -> None:
        if type(self).factory is None:
            raise ValueError("SchedulerMachine.factory is not set; use scheduler_machine(factory)")
        self.bs, self.num_blocks, self.max_num_seqs, self.budget = block_size, num_blocks, max_num_seqs, budget
        self.alloc = type(self).allocator_factory(num_blocks, block_size)
        self.sched = type(self).factory(self.alloc, block_size, max_num_seqs, budget)
        self.cap = num_blocks * block_size
        self.reqs: dict[str, Request] = {}
        self.expected: dict[str, tuple[list[int], str, int | None]] = {}
        self.reported: dict[str, list[int]] = {}
        self.done: set[str] = set()          # reported finished
        self.aborted: set[str] = set()
        self.prefixes: list[list[int]] = []
        self.kv: dict[tuple[int, int], int] = {}
        self.clock = 0.0
        self.num_steps = 0
        for _ in range(burst):           # a burst of arrivals, so that preemption happens early
            self._arrive(data)

    # -- rules --
    @rule(data=st.data(), count=st.integers(1, 3))
    def arrive(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            if len(self.reqs) < self.max_requests:
                self._arrive(data)

    def _arrive(self, data: st.DataObject) -> None:
        draw = data.draw
        kind = draw(st.sampled_from(["ok"] * 10 + ["too_big", "too_long"]))
        longest = min(self.budget if self.prompts_within_budget else 24, self.cap - 1)
        if draw(st.integers(0, 3)):      # mostly short prompts, so that several run and grow
            longest = min(longest, max(1, self.cap // 3))
        plen = draw(st.integers(1, longest))
        if kind == "too_big":
            plen = self.cap + draw(st.integers(1, self.bs))
        if self.prefixes and draw(st.booleans()):
            pre = draw(st.sampled_from(self.prefixes))[:plen]
        else:
            pre = []
        prompt = pre + draw(st.lists(st.integers(0, VOCAB - 1), min_size=plen - len(pre), max_size=plen - len(pre)))
        if len(prompt) >= 2 and len(self.prefixes) < 4:
            self.prefixes.append(prompt)
        max_tokens = draw(st.integers(1, max(1, min(8, self.cap - plen))))
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=draw(st.integers(0, min(2, max_tokens))),
            ignore_eos=draw(st.booleans()),
            stop_token_ids=draw(st.one_of(st.none(), st.lists(st.integers(0, VOCAB - 1), max_size=2))))
        max_len = None
        if kind == "too_long" and plen >= 2:
            max_len = plen - 1
        elif draw(st.integers(0, 3)) == 0:
            max_len = plen + draw(st.integers(0, max_tokens))
        rid = f"r{len(self.reqs)}"
        self.clock += 1.0
        req = Request(rid, prompt, params, eos_token_id=draw(st.one_of(st.none(), st.integers(0, VOCAB - 1))),
                      arrival_time=self.clock, priority=draw(st.integers(0, 2)),
                      cache_salt=draw(st.sampled_from([0, 0, 1])), max_model_len=max_len)
        rejected = plen > self.cap or (max_len is not None and plen > max_len)
        self.expected[rid] = ([], "rejected", None) if rejected else expected_output(req)
        self.reqs[rid] = req
        self.reported[rid] = []
        self.sched.add_request(req)

    @rule(data=st.data(), count=st.integers(1, 4))
    def step(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            self._draft(data)
            self._step()

    def _draft(self, data: st.DataObject | None) -> None:
        """Draft tokens for decoding requests: k drafts, the first `wrong` of them correct
        (drawn, or a fixed cycle in the teardown drain where nothing can be drawn)."""
        for j, r in enumerate(self._live()):
            k = wrong = 0
            if self.speculative and r.output_token_ids and r.num_computed_tokens == r.num_tokens - 1:
                if data is not None:
                    k = data.draw(st.integers(0, 3))
                    wrong = data.draw(st.integers(0, k))
                else:
                    k, wrong = (self.num_steps + j) % 4, (self.num_steps // 4 + j) % 4
            true = [fake_token(r.request_id, r.num_tokens + i, VOCAB) for i in range(k)]
            r.spec_token_ids = [t if i < wrong else (t + 1) % VOCAB for i, t in enumerate(true)]

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = [r.request_id for r in self._live()]
        rid = data.draw(st.sampled_from(live + ["no-such-request"] + sorted(self.reqs)[:1]))
        req = self.reqs.get(rid)
        was_live = req is not None and not req.status.finished
        # rejected at add_request, not yet reported: abort drops the report (the caller knows)
        unreported = (req is not None and req.status is RequestStatus.FINISHED_IGNORED
                      and rid not in self.done)
        self.sched.abort([rid])
        if unreported:
            self.aborted.add(rid)
        if was_live:
            assert req.status is RequestStatus.FINISHED_ABORTED, \
                f"abort({rid!r}): status is {req.status}, expected FINISHED_ABORTED"
            assert not req.block_ids, f"abort({rid!r}) left blocks {req.block_ids} in its block table"
            self.aborted.add(rid)
        elif req is not None:
            assert req.status.finished, f"abort of finished {rid!r} changed its status to {req.status}"

    @invariant()
    def blocks_consistent(self) -> None:
        if not hasattr(self, "sched"):
            return
        holders: Counter[int] = Counter()
        for rid, r in self.reqs.items():
            if r.status.finished:
                assert not r.block_ids, f"finished request {rid} ({r.status.name}) still holds blocks {r.block_ids}"
            assert len(set(r.block_ids)) == len(r.block_ids), f"{rid}'s block table repeats a block: {r.block_ids}"
            holders.update(r.block_ids)
        ref = getattr(self.alloc, "ref_count", None)
        if ref is not None:
            for b in range(self.num_blocks):
                assert ref(b) == holders[b], (f"block {b}: allocator ref count {ref(b)}, but {holders[b]} live "
                                              "requests hold it (a leak or a double free)")
        free = self.alloc.num_free_blocks()
        assert free == self.num_blocks - len(holders), \
            f"{free} blocks free, but {len(holders)} of {self.num_blocks} are held by live requests"
        if any(rid not in self.done and rid not in self.aborted for rid in self.reqs):
            assert self.sched.has_unfinished(), "has_unfinished() is False with requests still unfinished"
        kv = getattr(self.sched, "kv", None)
        host = getattr(kv, "host", None)
        if host is not None:         # host slots: owned exactly by the swapped-out requests
            assert host.num_owned() == kv.num_host_slots_held(), \
                f"host pool: {host.num_owned()} owned slots, swapped-out requests hold {kv.num_host_slots_held()}"
            for rid, r in self.reqs.items():
                if kv.is_swapped(rid):
                    assert r.status is RequestStatus.PREEMPTED and not r.block_ids, \
                        f"{rid} is swapped out but {r.status.name} with blocks {r.block_ids}"

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        todo = [r for r in self.reqs.values() if r.request_id not in self.done | self.aborted]
        bound = 10 * sum(r.num_prompt_tokens + r.sampling_params.max_tokens + 1 for r in todo) + 20
        for _ in range(bound):
            if not self.sched.has_unfinished():
                break
            self._draft(None)
            self._step()
        left = [rid for rid in self.reqs if rid not in self.done | self.aborted]
        assert not left and not self.sched.has_unfinished(), \
            f"after arrivals stopped, {left} did not finish within {bound} steps (starvation or livelock)"
        self.blocks_consistent()
        assert self.alloc.num_free_blocks() == self.num_blocks, \
            f"all requests finished but only {self.alloc.num_free_blocks()} of {self.num_blocks} blocks are free"
        host = getattr(getattr(self.sched, "kv", None), "host", None)
        if host is not None:
            assert host.num_owned() == 0, f"all requests finished but {host.num_owned()} host slots are owned"

    # -- one engine step with the fake model --
    def _live(self) -> list[Request]:
        return [r for r in self.reqs.values() if not r.status.finished]

    def _step(self) -> None:
        before = {rid for rid, r in self.reqs.items()}
        out = self.sched.schedule()
        self.num_steps += 1
        self._apply_copies(out)
        self._check_schedule(out)
        sampled: dict[str, list[int]] = {}
        for s in out.scheduled:
            r, table = s.request, s.block_ids
            toks = r.token_ids_slice(s.start, s.end)
            for p, t in zip(range(s.start, s.end), toks):
                self.kv[(table[p // self.bs], p % self.bs)] = t
            if s.samples:
                n = r.num_tokens
                acc: list[int] = []
                for i, d in enumerate(r.token_ids_slice(n, s.end)):
                    if d != fake_token(r.request_id, n + i, VOCAB):
                        break
                    acc.append(d)
                sampled[r.request_id] = acc + [fake_token(r.request_id, n + len(acc), VOCAB)]
        drafted = {s.request_id: s.num_spec_tokens for s in out.scheduled if s.samples and s.num_spec_tokens}
        self._check_outputs(self.sched.update(out, StepResult(sampled, num_draft_tokens=drafted)))
        for rid in before:
            if self.expected[rid][1] == "rejected":
                assert rid in self.done | self.aborted, f"{rid} can never fit but was not reported as rejected by this step"

    def _apply_copies(self, out: SchedulerOutput) -> None:
        """The step's block copies on the fake KV, in the runner's order: swap-outs to the host
        (`self.host_kv`: (slot, offset) -> token), swap-ins, copy-on-write. A swapped-out block
        the device cache no longer holds is poisoned in between, so a position computed from
        it without its swap-in holds no token."""
        bs = self.bs
        host = self.__dict__.setdefault("host_kv", {})
        for b, s in out.blocks_to_swap_out:
            for o in range(bs):
                host[(s, o)] = self.kv.get((b, o))
        cached = getattr(self.alloc, "cached_blocks", None)
        keep = cached() if cached is not None else frozenset(getattr(self.alloc, "hash_of", ()))
        for b, _ in out.blocks_to_swap_out:
            if b not in keep:
                for o in range(bs):
                    self.kv.pop((b, o), None)
        for s, b in out.blocks_to_swap_in:
            for o in range(bs):
                self.kv[(b, o)] = host.get((s, o))
        for src, dst in out.blocks_to_copy:
            for o in range(bs):
                self.kv[(dst, o)] = self.kv.get((src, o))

    def _check_schedule(self, out: SchedulerOutput) -> None:
        n = out.total_num_scheduled_tokens
        assert n <= self.budget, f"scheduled {n} tokens, over max_num_batched_tokens={self.budget}"
        assert len(out.scheduled) <= self.max_num_seqs, \
            f"scheduled {len(out.scheduled)} requests, over max_num_seqs={self.max_num_seqs}"
        ids = [s.request_id for s in out.scheduled]
        assert len(set(ids)) == len(ids), f"a request is scheduled twice in one step: {ids}"
        tables: Counter[int] = Counter()
        for r in self._live():
            tables.update(r.block_ids)
        for s in out.scheduled:
            r, rid = s.request, s.request_id
            assert self.reqs.get(rid) is r, f"scheduled unknown request {rid!r}"
            assert r.status is RequestStatus.RUNNING, f"scheduled {rid} with status {r.status.name}"
            assert self.expected[rid][1] != "rejected", f"scheduled {rid}, which can never fit"
            assert s.num_new_tokens >= 1, f"{rid} scheduled with {s.num_new_tokens} tokens"
            assert s.start == r.num_computed_tokens, \
                f"{rid} scheduled from {s.start} but has {r.num_computed_tokens} computed tokens"
            assert s.end <= r.num_tokens_with_spec, \
                f"{rid} scheduled up to {s.end}, past its {r.num_tokens_with_spec} tokens (with drafts)"
            assert s.num_spec_tokens == max(0, s.end - r.num_tokens), \
                f"{rid}: num_spec_tokens={s.num_spec_tokens}, but {max(0, s.end - r.num_tokens)} drafts scheduled"
            assert list(s.block_ids) == r.block_ids, \
                f"{rid}: scheduled block table {s.block_ids} differs from request.block_ids {r.block_ids}"
            assert len(s.block_ids) * self.bs >= s.end, \
                f"{rid}: {len(s.block_ids)} blocks of {self.bs} cannot hold positions up to {s.end}"
            toks = r.all_token_ids
            for p in range(s.start):
                got = self.kv.get((s.block_ids[p // self.bs], p % self.bs))
                assert got == toks[p], (f"{rid}: position {p} (block {s.block_ids[p // self.bs]}) holds KV of "
                                        f"token {got}, expected {toks[p]}: wrong block table or prefix hit")
            for b in {s.block_ids[p // self.bs] for p in range(s.start, s.end)}:
                assert tables[b] == 1, f"{rid} writes into block {b}, which another live request also holds"

    def _check_outputs(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            rid = o.request_id
            assert rid in self.reqs, f"output for unknown request {rid!r}"
            assert rid not in self.done, f"output for {rid}, which was already reported finished"
            assert rid not in self.aborted, f"output for {rid} after it was aborted"
            exp, reason, stop_reason = self.expected[rid]
            got = self.reported[rid]
            want = exp[len(got):len(got) + len(o.new_token_ids)]
            assert list(o.new_token_ids) == want, \
                f"{rid}: new tokens {o.new_token_ids}, the model dictates {want} (after {got})"
            got.extend(o.new_token_ids)
            assert self.reqs[rid].output_token_ids == got or reason == "rejected", \
                f"{rid}: output_token_ids {self.reqs[rid].output_token_ids} differ from reported {got}"
            if o.finished:
                assert (got, o.finish_reason) == (exp, reason), \
                    f"{rid} finished with {got} ({o.finish_reason}), expected {exp} ({reason})"
                assert o.stop_reason == stop_reason, f"{rid}: stop_reason {o.stop_reason}, expected {stop_reason}"
                assert self.reqs[rid].status.finished, f"{rid} reported finished with status {self.reqs[rid].status}"
                self.done.add(rid)
        for rid, r in self.reqs.items():
            if r.status.finished and rid not in self.aborted:
                assert rid in self.done, f"{rid} finished ({r.status.name}) without a finished RequestOutput"


def scheduler_machine(factory: SchedulerFactory, *, allocator_factory: AllocatorFactory | None = None,
                      speculative: bool = True, max_requests: int = 12,
                      prompts_within_budget: bool = False) -> type[SchedulerMachine]:
    """A SchedulerMachine subclass bound to `factory(allocator, block_size, max_num_seqs,
    max_num_batched_tokens) -> scheduler` (and `allocator_factory(num_blocks, block_size)`).
    prompts_within_budget=True keeps prompts <= max_num_batched_tokens (no chunking needed)."""
    attrs: dict[str, Any] = {"factory": staticmethod(factory), "speculative": speculative,
                             "max_requests": max_requests, "prompts_within_budget": prompts_within_budget}
    if allocator_factory is not None:
        attrs["allocator_factory"] = staticmethod(allocator_factory)
    return type("BoundSchedulerMachine", (SchedulerMachine,), attrs)


def check_scheduler(factory: SchedulerFactory, *, allocator_factory: AllocatorFactory | None = None,
                    speculative: bool = True, max_requests: int = 12, prompts_within_budget: bool = False,
                    settings: Settings | None = None) -> None:
    """Run the scheduler state machine; raises (with a shrunk example) on the first violation.
    Uses the current hypothesis profile, with stateful_step_count=30 unless `settings` is given."""
    machine = scheduler_machine(factory, allocator_factory=allocator_factory, speculative=speculative,
                                max_requests=max_requests, prompts_within_budget=prompts_within_budget)
    run_state_machine_as_test(machine, settings=settings or Settings(stateful_step_count=30, deadline=None))
