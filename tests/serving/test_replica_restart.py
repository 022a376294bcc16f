"""ReplicaSetCore's restarts over fake cores (no processes): a dead replica is started again
from its factory after the back-off, replaces the dead core empty, takes requests again;
the dead core's late callbacks are ignored; restarts are bounded (and off with 0); a start
under way when the set closes is closed; with every replica dead but one restarting the set
is not declared dead."""

from __future__ import annotations

import threading
import time

import pytest
from test_replica_set import FakeCore, Front

from toolkit.entrypoints.core_thread import EngineDeadError
from toolkit.entrypoints.replica_set import ReplicaSetCore
from toolkit.routing import CacheAwareRouter, RoundRobinRouter


class Factory:
    """Builds FakeCores; `fail` (a count) makes the next starts raise, `gate` holds them."""

    def __init__(self, fail: int = 0, gate: threading.Event | None = None) -> None:
        self.built: list[FakeCore] = []
        self.fail, self.gate = fail, gate
        self.die_at_start = 0            # the next starts give a core that dies at once

    def __call__(self, on_o, on_e):
        if self.gate is not None:
            self.gate.wait(10)
        if self.built and self.fail:
            self.fail -= 1
            raise RuntimeError("no memory")
        self.built.append(FakeCore(on_o, on_e))
        if len(self.built) > 1 and self.die_at_start:
            self.die_at_start -= 1
            self.built[-1].die()         # its death reaches the set before it is put in place
        return self.built[-1]


def make(n=2, router=None, **kw):
    front = Front()
    factories = [Factory() for _ in range(n)]
    rs = ReplicaSetCore(factories, router or RoundRobinRouter(), front.on_outputs, front.on_error,
                        block_size=4, **kw)
    return rs, factories, front


def settle(rs, timeout=10.0):
    deadline = time.monotonic() + timeout
    while rs.restarting and time.monotonic() < deadline:
        time.sleep(0.002)
    assert not rs.restarting


def test_a_dead_replica_is_restarted_and_routed_to_again():
    rs, (f0, f1), front = make(router=CacheAwareRouter(block_size=4), max_restarts=2, restart_backoff=0)
    old = f1.built[0]
    rs.add("a", list(range(8)), None, {})            # no prefix yet: least loaded, lower index -> 0
    rs.add("b", list(range(20, 28)), None, {})       # -> 1
    assert "b" in old.adds
    old.accept("b")
    old.emit("b", [7])                               # b streams, then its replica dies
    old.die()
    settle(rs)
    new = f1.built[1]
    assert rs.cores[1] is new and new.alive and new.observing and not old.alive
    assert rs.all_alive and rs.stats["restarts"] == [0, 1] and rs.stats["deaths"] == [0, 1]
    assert [rids for _, rids in front.errors] == [["b"]]           # b's failure stands
    assert len(rs._hashes[1]) == 0 and rs.views()[1].load == 0    # it came back empty
    old.on_outputs([], [])                           # the dead core's late callbacks: ignored
    old.on_error(EngineDeadError("late"))
    assert rs.all_alive and len(front.errors) == 1 and rs.stats["deaths"] == [0, 1]
    rs.add("c", list(range(40, 48)), None, {})       # least loaded among equals -> 1 (0 has a)
    assert "c" in new.adds
    new.accept("c")
    new.emit("c", [1], finished=True)
    assert front.outputs[-1].request_id == "c" and rs.views()[1].load == 0
    rs.close()
    assert not new.alive and not f0.built[0].alive


def test_restarts_are_bounded_and_failed_starts_count():
    rs, (f0, f1), front = make(max_restarts=2, restart_backoff=0)
    f1.fail = 5                                      # every restart fails
    f1.built[0].die()
    settle(rs)
    assert not rs.views()[1].alive and rs.stats["restarts"] == [0, 0] and rs.alive
    assert rs._attempts == [0, 2]
    f0.fail = 1                                      # replica 0: one failed start, then back
    f0.built[0].die()
    settle(rs)
    assert rs.views()[0].alive and rs.stats["restarts"] == [1, 0] and rs._attempts == [2, 2]
    f0.built[1].die()                                # its restarts are spent: the set is dead
    settle(rs)
    assert not rs.alive and front.errors[-1][1] is None
    assert len(f0.built) == 2 and len(f1.built) == 1
    rs.close()


def test_a_core_that_dies_before_it_is_in_place_is_another_attempt():
    rs, (_, f1), front = make(max_restarts=3, restart_backoff=0)
    f1.die_at_start = 1
    f1.built[0].die()
    settle(rs)
    assert len(f1.built) == 3 and rs.cores[1] is f1.built[2] and rs.all_alive
    assert rs.stats["restarts"] == [0, 1] and rs._attempts == [0, 2] and rs.stats["deaths"] == [0, 2]
    assert all(rids is not None for _, rids in front.errors)       # the set was never declared dead
    rs.close()


def test_max_restarts_zero_leaves_a_dead_replica_dead():
    rs, (_, f1), _ = make()                          # the set's default: 0
    f1.built[0].die()
    assert not rs.restarting and not rs.views()[1].alive and len(f1.built) == 1
    rs.close()


def test_while_every_replica_is_down_and_one_restarts_the_set_waits():
    gate = threading.Event()
    rs, (f0, f1), front = make(max_restarts=1, restart_backoff=0)
    f1.gate = gate
    f0.built[0].die()                                # no restart left after this one for 0? (1 attempt)
    settle(rs)
    assert rs.views()[0].alive
    f1.built[0].die()                                # restarting, held at the gate
    f0.built[1].die()                                # 0's restarts spent
    assert rs.restarting == [1] and rs.alive and not rs.all_alive
    assert all(rids is not None for _, rids in front.errors)      # the set was not declared dead
    refused = rs.add("x", [1], None, {})
    assert isinstance(refused.exception(), EngineDeadError) and "no live replica" in str(refused.exception())
    gate.set()
    settle(rs)
    assert rs.alive and rs.views()[1].alive
    rs.add("y", [1], None, {})
    assert "y" in f1.built[1].adds
    rs.close()


def test_close_during_a_back_off_or_a_start_leaks_nothing():
    rs, (_, f1), _ = make(max_restarts=3, restart_backoff=30)
    f1.built[0].die()
    assert rs.restarting == [1]
    t = time.monotonic()
    rs.close()                                       # the back-off wait ends at once
    assert time.monotonic() - t < 5 and not rs.restarting and len(f1.built) == 1

    gate = threading.Event()
    rs, (_, f1), _ = make(max_restarts=3, restart_backoff=0)
    f1.gate = gate
    f1.built[0].die()
    threading.Timer(0.05, gate.set).start()
    rs.close()                                       # waits for the start, then closes its core
    assert len(f1.built) == 2 and not f1.built[1].alive and not rs.restarting


def test_bad_restart_settings_are_refused():
    with pytest.raises(ValueError, match="max_restarts"):
        make(max_restarts=-1)
    with pytest.raises(ValueError, match="restart_backoff"):
        make(restart_backoff=-0.5)


def test_serve_flag_and_engine_defaults():
    import inspect

    from toolkit.entrypoints.data_parallel import DPAsyncEngine
    from toolkit.serve import parse_args

    assert parse_args([]).data_parallel_max_restarts == 3
    assert parse_args(["-dp", "2", "--data-parallel-max-restarts", "0"]).data_parallel_max_restarts == 0
    sig = inspect.signature(DPAsyncEngine)
    assert sig.parameters["max_restarts"].default == 3 and sig.parameters["restart_backoff"].default == 1.0


def test_ray_replicas_restart_through_ray_not_the_set(monkeypatch):
    from toolkit.entrypoints import core_ray
    from toolkit.entrypoints.data_parallel import DPAsyncEngine

    seen = []

    def fake_ray_factories(model, options, n, **kw):
        seen.append(kw)
        return [FakeCore] * n

    monkeypatch.setattr(core_ray, "ray_factories", fake_ray_factories)
    for ray_options, want in ((None, 2), ({"max_restarts": 5}, 5)):
        engine = DPAsyncEngine(None, backend="ray", max_restarts=2, ray_options=ray_options)
        assert seen[-1]["max_restarts"] == want and engine.core.max_restarts == 0
        engine.core.cores[0].restarts = 4                       # what RayCore counts
        assert [s["restarts"] for s in engine.replica_stats()] == [4, 0]
        engine.close()


class SelfRestartingCore(FakeCore):
    """A core that restarts itself (as RayCore does through Ray): `comes_back(ok)` settles the
    restart its death started."""
    restarts_itself = True

    def die(self):
        self.outcome = None
        super().die()

    def wait_restart(self, timeout):
        if getattr(self, "outcome", True) is None:
            time.sleep(min(timeout, 0.01))
        return getattr(self, "outcome", True)

    def comes_back(self, ok):
        self.alive = ok
        self.outcome = ok


def test_a_core_that_restarts_itself_keeps_the_set_alive_while_it_comes_back():
    rs, front = _self_restarting(1)
    core = rs.cores[0]
    core.die()                                       # the only replica: lost, Ray restarting it
    assert rs.restarting == [0] and rs.alive and not rs.all_alive
    assert all(rids is not None for _, rids in front.errors)       # not declared dead
    core.comes_back(True)
    settle(rs)
    assert rs.all_alive and rs.cores[0] is core and rs.stats["deaths"] == [1]
    rs.add("a", [1, 2], None, {})                    # routed to it again, same callbacks
    core.accept("a")
    core.emit("a", [4], finished=True)
    assert front.outputs[-1].request_id == "a"
    rs.close()


def test_a_core_that_will_not_come_back_ends_the_set():
    rs, front = _self_restarting(1)
    rs.cores[0].die()
    rs.cores[0].comes_back(False)                    # Ray's restarts spent
    settle(rs)
    assert not rs.alive and front.errors[-1][1] is None
    rs.close()


def test_close_while_a_core_restarts_itself_does_not_wait_for_it():
    rs, _ = _self_restarting(2)
    rs.cores[1].die()                                # never settles
    t = time.monotonic()
    rs.close()
    assert time.monotonic() - t < 5 and not rs.restarting


def _self_restarting(n):
    front = Front()
    rs = ReplicaSetCore([SelfRestartingCore] * n, RoundRobinRouter(), front.on_outputs, front.on_error,
                        block_size=4, max_restarts=0)
    return rs, front
