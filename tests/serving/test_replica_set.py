"""ReplicaSetCore over fake cores (no processes): routing bookkeeping and every fault path,
step by step."""

from __future__ import annotations

import concurrent.futures
import types

import pytest

from toolkit.entrypoints.core_thread import EngineDeadError
from toolkit.entrypoints.replica_set import RecentHashes, ReplicaDiedError, ReplicaSetCore
from toolkit.routing import CacheAwareRouter, RoundRobinRouter
from toolkit.types import CompletionOutput, RequestOutput


class FakeCore:
    tokenizer, max_model_len, vocab_size = None, 128, 100
    restarts_itself = False

    def __init__(self, on_outputs, on_error):
        self.on_outputs, self.on_error = on_outputs, on_error
        self.alive = True
        self.adds: dict[str, concurrent.futures.Future] = {}
        self.aborted: list[str] = []
        self.observing = False

    def add(self, rid, prompt, params, fields):
        self.adds[rid] = concurrent.futures.Future()
        return self.adds[rid]

    def accept(self, rid):
        self.adds[rid].set_result(rid)

    def abort(self, rids):
        self.aborted += rids

    def observe(self, on):
        self.observing = on

    def call(self, fn):
        f = concurrent.futures.Future()
        f.set_result(fn(self))
        return f

    def close(self):
        self.alive = False

    def emit(self, rid, tokens, finished=False):
        self.on_outputs([RequestOutput(rid, finished=finished, outputs=[
            CompletionOutput(0, "x" * len(tokens), tokens, "length" if finished else None)])], [])

    def die(self):
        """A dead process: pending adds fail first, then the error for everyone (ProcessCore's order)."""
        self.alive = False
        for f in self.adds.values():
            if not f.done():
                f.set_exception(EngineDeadError("exited"))
        self.on_error(EngineDeadError("exited"))


class Front:
    def __init__(self):
        self.outputs, self.errors = [], []

    def on_outputs(self, outs, records):
        self.outputs += outs

    def on_error(self, error, rids=None):
        self.errors.append((error, rids))


def make(n=2, router=None):
    front = Front()
    cores = []

    def factory(on_o, on_e):
        core = FakeCore(on_o, on_e)
        cores.append(core)
        return core

    rs = ReplicaSetCore([factory] * n, router or RoundRobinRouter(), front.on_outputs, front.on_error, block_size=4)
    cores.sort(key=lambda c: rs.cores.index(c))
    return rs, cores, front


def test_routes_counts_and_forgets():
    rs, (c0, c1), front = make()
    assert all(c.observing for c in (c0, c1))
    f = [rs.add(f"r{k}", [1, 2, 3], None, {}) for k in range(3)]
    assert set(c0.adds) == {"r0", "r2"} and set(c1.adds) == {"r1"}
    c0.accept("r0")
    assert f[0].result() == "r0"
    assert [(v.num_waiting, v.num_running) for v in rs.views()] == [(2, 0), (1, 0)]
    c0.emit("r0", [5])
    assert [(v.num_waiting, v.num_running) for v in rs.views()] == [(1, 1), (1, 0)]
    c0.emit("r0", [6], finished=True)
    assert rs.replica_of("r0") is None and rs.views()[0].load == 1
    c1.emit("r0", [9])                                 # a replica the request is not on: dropped
    assert [o.request_id for o in front.outputs] == ["r0", "r0"]
    rs.abort(["r1", "nope"])
    assert c1.aborted == ["r1"] and rs.views()[1].load == 0


def test_a_refused_add_is_the_callers_error():
    rs, (c0, _), _ = make()
    f = rs.add("r0", [1], None, {})
    c0.adds["r0"].set_exception(ValueError("prompt too long"))
    with pytest.raises(ValueError, match="too long"):
        f.result()
    assert rs.replica_of("r0") is None and rs.views()[0].load == 0


def test_a_death_retries_unstreamed_and_fails_streamed():
    rs, (c0, c1), front = make()
    f = {rid: rs.add(rid, [1, 2], None, {}) for rid in ("a", "b", "c", "d", "e")}   # a c e -> 0
    c0.accept("a")
    c0.accept("c")                                     # e: the add is still pending
    c0.emit("a", [7])                                  # a has streamed
    rs._last[0] = types.SimpleNamespace(kv_usage=0.5)  # replica 0's last step record
    c0.die()
    assert not rs.views()[0].alive and rs._last[0] is None    # out of the fleet's gauges
    # e (add pending) and c (accepted, silent) moved to replica 1; a failed with a clear error
    assert {"c", "e"} <= set(c1.adds)
    (err, rids), = front.errors
    assert rids == ["a"] and isinstance(err, ReplicaDiedError) and "replica 0 died" in str(err)
    c1.accept("e")
    assert f["e"].result() == "e"
    c1.accept("c")
    c1.emit("c", [3], finished=True)
    assert front.outputs[-1].request_id == "c" and front.outputs[-1].finished
    assert rs.stats["retried"] == [0, 2] and rs.stats["failed"] == [1, 0] and rs.stats["deaths"] == [1, 0]
    assert rs.alive and not rs.all_alive
    c1.die()                                           # the last one: everything ends, nothing waits
    assert not rs.alive and front.errors[-1][1] is None
    assert isinstance(rs.add("z", [1], None, {}).exception(), EngineDeadError)


def test_a_step_fault_ends_only_the_named_requests():
    rs, (c0, _), front = make()
    rs.add("a", [1], None, {})
    rs.add("b", [1], None, {})
    rs.add("c", [1], None, {})
    c0.accept("a")
    c0.accept("c")
    c0.on_error(RuntimeError("bad grammar"), ["a"])
    assert front.errors == [(front.errors[0][0], ["a"])] and rs.replica_of("c") == 0
    assert rs.stats["deaths"] == [0, 0]


def test_cache_aware_front_remembers_routed_prefixes():
    rs, (c0, c1), _ = make(router=CacheAwareRouter(block_size=4))
    system = list(range(10, 26))                       # 4 blocks
    rs.add("a", system + [1], None, {})
    rs.add("b", [99] * 8, None, {})                    # no shared prefix: least loaded -> 1
    rs.add("c", system + [2], None, {})                # the prefix routed to 0 before
    assert set(c0.adds) == {"a", "c"} and set(c1.adds) == {"b"}
    assert len(rs._hashes[0]) > 0
    c0.die()                                           # it comes back cold: nothing remembered
    assert len(rs._hashes[0]) == 0 and len(rs._hashes[1]) > 0


def test_recent_hashes_is_bounded():
    h = RecentHashes(3)
    h.add([1, 2, 3, 4])
    assert 1 not in h and 4 in h and len(h) == 3
    h.add([2])
    h.add([5])
    assert 2 in h and 3 not in h


def test_a_replica_that_fails_to_start_closes_the_others():
    started = []

    def ok(on_o, on_e):
        started.append(FakeCore(on_o, on_e))
        return started[-1]

    def broken(on_o, on_e):
        raise RuntimeError("no GPU")

    with pytest.raises(RuntimeError, match="no GPU"):
        ReplicaSetCore([ok, broken], RoundRobinRouter(), lambda *a: None, lambda *a: None)
    assert started and not started[0].alive


def test_serve_flags():
    from toolkit.serve import parse_args

    a = parse_args(["some/dir", "-dp", "4", "--data-parallel-backend", "ray", "--router", "prefix_affinity"])
    assert (a.data_parallel_size, a.data_parallel_backend, a.router) == (4, "ray", "prefix_affinity")
    a = parse_args([])
    assert (a.data_parallel_size, a.data_parallel_backend, a.router) == (1, "mp", "least_loaded")
    with pytest.raises(SystemExit):
        parse_args(["--router", "fastest"])


def test_a_thread_replica_whose_loop_crashes_is_dead_and_restarted():
    """A real ThreadCore whose step fails and whose abort then fails too (a lost device): its
    loop stops, the set counts a death, retries the unstreamed request on the other replica
    and restarts the dead one."""
    import threading
    import time

    from toolkit.entrypoints.core_thread import ThreadCore

    class Engine:
        tokenizer, max_model_len = None, 128
        model = types.SimpleNamespace(spec=types.SimpleNamespace(vocab_size=100))

        def __init__(self) -> None:
            self.reqs, self.crash = set(), threading.Event()
            self.scheduler = types.SimpleNamespace(has_unfinished=lambda: bool(self.reqs))

        def add_request(self, prompt, params, request_id, **fields):
            self.reqs.add(request_id)

        def abort(self, rids):
            if self.crash.is_set():
                raise RuntimeError("abort failed too (device lost)")
            self.reqs -= set(rids)

        def has_unfinished(self):
            return bool(self.reqs)

        def request_ids(self):
            return list(self.reqs)

        def step(self):
            if self.crash.is_set():
                raise RuntimeError("CUDA error: device-side assert")
            time.sleep(0.01)
            return []

        def add_observer(self, o):
            pass

        def remove_observer(self, o):
            pass

        def close(self):
            pass

    engines: list[Engine] = []

    def factory(on_outputs, on_error):
        engines.append(Engine())
        return ThreadCore(engines[-1], on_outputs, on_error)

    errors: list = []
    rs = ReplicaSetCore([factory, factory], RoundRobinRouter(), lambda o, r: None,
                        lambda e, rids=None: errors.append((e, rids)), max_restarts=3, restart_backoff=0)
    try:
        rs.add("a", [1, 2, 3], None, {}).result(5)
        first = rs.replica_of("a")
        engines[first].crash.set()
        deadline = time.monotonic() + 10
        while rs.stats["restarts"][first] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rs.stats["deaths"][first] == 1 and rs.stats["restarts"][first] == 1
        assert rs.replica_of("a") == 1 - first and rs.stats["retried"][1 - first] == 1
        assert not errors                                  # nothing had streamed: retried, not failed
    finally:
        rs.close()


def test_a_request_failed_before_its_add_landed_is_aborted_on_the_replica():
    """A whole-step fault on a live replica fails a request whose add is still queued there;
    when the replica takes it afterwards, the set aborts it (else it would run to max_tokens,
    its output dropped and its load uncounted)."""
    rs, (c0, _), front = make()
    f = rs.add("x", [1, 2], None, {})                  # -> replica 0, its add pending
    c0.on_error(RuntimeError("a step failed"))         # request_ids None, the core alive
    assert front.errors[-1][1] == ["x"] and rs.replica_of("x") is None and c0.aborted == []
    c0.accept("x")
    assert c0.aborted == ["x"] and f.result() == "x" and rs.views()[0].load == 0
