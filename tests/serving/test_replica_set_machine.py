"""ReplicaSetCore under generated streams of adds, accepts, tokens, finishes, aborts, step
faults and replica deaths (fake cores): the per-replica counts always match the requests
routed there, a dead replica is never sent a request, every request ends exactly once
(finished, failed or aborted) and nothing is left at the end."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from test_replica_set import FakeCore, Front  # noqa: F401  (FakeCore used by the factory)

from toolkit.entrypoints.replica_set import ReplicaSetCore
from toolkit.routing import LeastLoadedRouter

N = 3


class ReplicaSetMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.front = Front()
        self.cores: list[FakeCore] = []

        def factory(on_o, on_e):
            self.cores.append(FakeCore(on_o, on_e))
            return self.cores[-1]

        self.rs = ReplicaSetCore([factory] * N, LeastLoadedRouter(), self.front.on_outputs, self.front.on_error)
        self.cores.sort(key=lambda c: self.rs.cores.index(c))
        self.futures = {}
        self.ended: dict[str, str] = {}          # rid -> how it ended
        self.k = 0
        self.sent_after_death: list[str] = []
        self.streamed: set[str] = set()

    def _core_of(self, rid):
        i = self.rs.replica_of(rid)
        return None if i is None else self.rs.cores[i]

    def _live(self, accepted: bool):
        out = []
        for rid in list(self.rs._req):
            core = self._core_of(rid)
            if core is None or not core.alive or rid not in core.adds:
                continue
            if core.adds[rid].done() == accepted:
                out.append(rid)
        return sorted(out)

    def _end(self, rid, how):
        assert rid not in self.ended, f"{rid} ended twice: {self.ended[rid]} then {how}"
        self.ended[rid] = how

    @rule()
    def add(self):
        rid = f"r{self.k}"
        self.k += 1
        before = {i: set(c.adds) for i, c in enumerate(self.cores)}
        self.futures[rid] = self.rs.add(rid, [1, 2, 3], None, {})
        for i, c in enumerate(self.cores):
            if not c.alive and set(c.adds) != before[i]:
                self.sent_after_death.append(rid)
        f = self.futures[rid]
        if f.done() and f.exception() is not None:
            self._end(rid, "refused")

    @rule(data=st.data())
    def accept(self, data):
        pending = self._live(accepted=False)
        if pending:
            rid = data.draw(st.sampled_from(pending))
            self._core_of(rid).accept(rid)

    @rule(data=st.data(), finish=st.booleans())
    def emit(self, data, finish):
        live = self._live(accepted=True)
        if live:
            rid = data.draw(st.sampled_from(live))
            self._core_of(rid).emit(rid, [7], finished=finish)
            self.streamed.add(rid)
            if finish:
                self._end(rid, "finished")

    @rule(data=st.data())
    def abort(self, data):
        if self.rs._req:
            rid = data.draw(st.sampled_from(sorted(self.rs._req)))
            self.rs.abort([rid])
            self._end(rid, "aborted")

    @rule(data=st.data())
    def step_fault(self, data):
        live = self._live(accepted=True)
        if live:
            rid = data.draw(st.sampled_from(live))
            n = len(self.front.errors)
            self._core_of(rid).on_error(RuntimeError("fault"), [rid])
            assert self.front.errors[n:] == [(self.front.errors[n][0], [rid])]

    # a death with requests in flight and (mostly) a replica left to take them
    @precondition(lambda self: len(self.rs._req) >= 3 and sum(c.alive for c in self.cores) > 1)
    @rule(i=st.integers(0, N - 1))
    def kill(self, i):
        if not self.cores[i].alive:
            return
        on_it = [rid for rid in self.rs._req if self.rs.replica_of(rid) == i]
        streamed = [rid for rid in on_it if rid in self.streamed]
        n = len(self.front.errors)
        self.cores[i].die()
        self.errors_end_requests_once()
        failed = {rid for _, rids in self.front.errors[n:] for rid in rids or ()}
        for rid in streamed:                        # streamed: ended with ReplicaDiedError
            assert rid in failed and "died" in self.ended[rid]
        if any(c.alive for c in self.cores):        # the rest moved to a live replica
            for rid in set(on_it) - set(streamed):
                assert rid not in self.ended, f"{rid} had streamed nothing but ended: {self.ended[rid]}"
                assert self.rs.cores[self.rs.replica_of(rid)].alive

    @invariant()
    def errors_end_requests_once(self):
        for err, rids in self.front.errors[getattr(self, "_seen", 0):]:
            for rid in rids or ():
                if rid in self.futures:
                    self._end(rid, f"failed: {err}")
        self._seen = len(self.front.errors)
        for rid, f in self.futures.items():
            if f.done() and f.exception() is not None and rid not in self.ended:
                self._end(rid, "refused")

    @invariant()
    def counts_match_the_routed_requests(self):
        waiting, running = [0] * N, [0] * N
        for r in self.rs._req.values():
            if r.state == "waiting":
                waiting[r.replica] += 1
            elif r.state == "running":
                running[r.replica] += 1
        views = self.rs.views()
        assert [v.num_waiting for v in views] == waiting
        assert [v.num_running for v in views] == running
        assert not self.sent_after_death
        assert not set(self.rs._req) & set(self.ended)

    def teardown(self):
        for _ in range(3):                              # retries may land on another replica
            for rid in self._live(accepted=False):
                self._core_of(rid).accept(rid)
            for rid in self._live(accepted=True):
                self._core_of(rid).emit(rid, [1], finished=True)
                self._end(rid, "finished")
        self.errors_end_requests_once()
        assert not self.rs._req, self.rs._req
        assert set(self.ended) == set(self.futures)
        assert all(v.load == 0 for v in self.rs.views())


TestReplicaSet = ReplicaSetMachine.TestCase
TestReplicaSet.settings = settings(max_examples=40, stateful_step_count=40)
