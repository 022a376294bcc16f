"""ReplicaSetCore: N engine cores behind the one core interface AsyncEngine drives, each
request routed to one of them by a Router.

    front (AsyncEngine: streams, aborts, listeners)
      └─ ReplicaSetCore ── router.choose(request, views) ─▶ core 0 | core 1 | ... core N-1
                                                           (ProcessCore, RayCore, ThreadCore)

The set keeps, per request, the replica serving it and whether it has streamed anything;
per replica, the requests waiting (routed, nothing streamed yet) and running, the KV usage
of its last step and, for routers that read them, the block hashes of the prompts it was
sent (an LRU: what its prefix cache most likely holds). Those make the `ReplicaView`s the
router reads; they are exact at the front, never a step late.

Faults: a replica whose core stops (its process died, its actor was lost) is skipped by the
router while it is not alive. Its requests that had streamed nothing are routed again, to a
replica they have not tried (the caller's stream never notices); the others end with
`ReplicaDiedError`. A step fault inside a live replica ends only that replica's requests it
names, as with one engine. The set is alive while one replica is (or is being restarted).

Restarts (`max_restarts` > 0; the mp and thread backends, Ray restarts its own actors): a
replica found dead is started again by a supervisor thread, from the factory that built it,
after a back-off (`restart_backoff` s, doubling with each attempt, at most 30 s); a start
that fails is an attempt too. Once the new core answers (its engine built) it replaces the
dead one, empty (no requests, no cached prefixes), and the router may choose it again; the
requests the death failed or moved stay where they went. At most `max_restarts` attempts
per replica over the set's life; then it stays dead. A dead core's late callbacks are
ignored (each core's callbacks carry its generation).

A core that declares `restarts_itself` (RayCore: Ray restarts the actor) is not rebuilt by
the set: a watcher thread waits on its `wait_restart(timeout)` (True: back, False: it will
not come back, None: not yet) and counts as a restart under way meanwhile, so the set is
not declared dead while Ray brings its replicas back, and is once they will not come back.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Sequence

from toolkit.entrypoints.core_thread import EngineDeadError, OnError, OnOutputs
from toolkit.routing.base import NoReplicaAlive, ReplicaView, RouteRequest
from toolkit.routing.prefix import prompt_hashes

log = logging.getLogger(__name__)

CoreFactory = Callable[[OnOutputs, OnError], Any]     # (on_outputs, on_error) -> a started core


class ReplicaDiedError(EngineDeadError):
    """The replica serving a request died after the request had streamed output (a request
    that had streamed nothing is retried on another replica instead)."""


class RecentHashes:
    """The block hashes most recently routed to a replica (an LRU of `capacity`); a router
    reads membership only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()

    def add(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def __contains__(self, h: object) -> bool:
        return h in self._lru

    def __len__(self) -> int:
        return len(self._lru)


@dataclasses.dataclass(eq=False)
class _Routed:
    """One request of the front: where it runs and what a retry needs (kept until it streams)."""

    prompt: Any
    params: Any
    fields: dict[str, Any]
    route: RouteRequest
    replica: int = -1
    state: str | None = None          # "waiting" | "running" | None (not counted on any replica)
    accepted: bool = False            # its replica's add succeeded
    tried: set[int] = dataclasses.field(default_factory=set)


class ReplicaSetCore:
    def __init__(self, factories: Sequence[CoreFactory], router: Any, on_outputs: OnOutputs,
                 on_error: OnError, *, block_size: int = 16, recent_hashes: int = 1 << 16,
                 max_restarts: int = 0, restart_backoff: float = 1.0) -> None:
        if not factories:
            raise ValueError("a replica set needs at least one replica")
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0 (0: never restart), got {max_restarts!r}")
        if not isinstance(restart_backoff, (int, float)) or isinstance(restart_backoff, bool) or restart_backoff < 0:
            raise ValueError(f"restart_backoff must be a number of seconds >= 0, got {restart_backoff!r}")
        n = len(factories)
        self.factories = list(factories)       # what a restart calls again
        self.max_restarts, self.restart_backoff = max_restarts, float(restart_backoff)
        self._gen = [0] * n                     # each replica's core generation (bumped per restart)
        self._attempts = [0] * n                # restart attempts made, per replica
        self._restarting: dict[int, threading.Thread] = {}
        self._stop = threading.Event()
        self.router = router
        self._on_outputs, self._on_error = on_outputs, on_error
        self._lock = threading.RLock()
        self._req: dict[str, _Routed] = {}
        self._count = {"waiting": [0] * n, "running": [0] * n}
        self._last = [None] * n                 # each replica's last StepRecord
        self.stats = {k: [0] * n for k in ("routed", "retried", "failed", "deaths", "steps", "restarts")}
        self._observing = False
        self._closing = False
        self.block_size = block_size
        self._hashes = ([RecentHashes(recent_hashes) for _ in range(n)]
                        if getattr(router, "uses_cached_blocks", False) else None)
        self.cores: list[Any] = []
        # every replica starts at once (each loads a model); any failure closes the others
        with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="toolkit-replica-start") as pool:
            futs = [pool.submit(make, *self._callbacks(i)) for i, make in enumerate(factories)]
        started, errors = [], []
        for f in futs:
            try:
                started.append(f.result())
            except BaseException as e:
                errors.append(e)
        if errors:
            for core in started:
                core.close()
            raise errors[0]
        self.cores = started
        for core in self.cores:
            core.observe(True)                  # KV usage for the views, totals for /metrics
        first = self.cores[0]
        self.tokenizer, self.max_model_len, self.vocab_size = first.tokenizer, first.max_model_len, first.vocab_size
        self.error: BaseException | None = None

    # -- state --
    @property
    def alive(self) -> bool:
        """A replica is alive, or one is being restarted (requests meanwhile: no live replica)."""
        return not self._closing and (any(c.alive for c in self.cores) or bool(self._restarting))

    @property
    def restarting(self) -> list[int]:
        """The replicas a supervisor is starting again now."""
        return sorted(self._restarting)

    @property
    def all_alive(self) -> bool:
        return not self._closing and all(c.alive for c in self.cores)

    @property
    def num_steps(self) -> int:
        return sum(self.stats["steps"])

    def views(self, exclude: set[int] = frozenset()) -> list[ReplicaView]:
        """What the router reads: one read-only view per replica (`exclude`: shown dead)."""
        with self._lock:
            return [ReplicaView(i, alive=c.alive and i not in exclude,
                                num_running=self._count["running"][i], num_waiting=self._count["waiting"][i],
                                kv_usage=self._last[i].kv_usage if self._last[i] is not None else 0.0,
                                cached_blocks=self._hashes[i] if self._hashes is not None else frozenset())
                    for i, c in enumerate(self.cores)]

    def replica_of(self, request_id: str) -> int | None:
        r = self._req.get(request_id)
        return None if r is None else r.replica

    # -- what the front calls --
    def add(self, request_id: str, prompt: Any, params: Any, fields: dict[str, Any]
            ) -> concurrent.futures.Future:
        outer: concurrent.futures.Future = concurrent.futures.Future()
        route = RouteRequest(request_id, self._token_ids(prompt), fields.get("client_id"),
                             int(fields.get("cache_salt", 0) or 0))
        r = _Routed(prompt, params, dict(fields), route)
        with self._lock:
            self._req[request_id] = r
        self._dispatch(request_id, r, outer)
        return outer

    def abort(self, request_ids: list[str]) -> None:
        by_replica: dict[int, list[str]] = {}
        with self._lock:
            for rid in request_ids:
                r = self._req.pop(rid, None)
                if r is not None:
                    self._uncount(r)
                    by_replica.setdefault(r.replica, []).append(rid)
        for i, rids in by_replica.items():
            if i >= 0 and self.cores[i].alive:
                self.cores[i].abort(rids)

    def forget_prefixes(self) -> None:
        """The replicas' prefix caches were reset: what the front remembers of them goes too."""
        with self._lock:
            if self._hashes is not None:
                self._hashes = [RecentHashes(h.capacity) for h in self._hashes]

    def call_one(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """fn(engine) on the first live replica; a Future of its result."""
        for c in self.cores:
            if c.alive:
                return c.call(fn)
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_exception(EngineDeadError("no replica is alive"))
        return out

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """fn(engine) on every live replica; a Future of the list of their results."""
        futs = [c.call(fn) for c in self.cores if c.alive]
        out: concurrent.futures.Future = concurrent.futures.Future()
        if not futs:
            out.set_exception(EngineDeadError("no replica is alive"))
            return out
        left = [len(futs)]

        def done(_: concurrent.futures.Future) -> None:
            with self._lock:
                left[0] -= 1
                if left[0]:
                    return
            errors = [f.exception() for f in futs if f.exception() is not None]
            out.set_exception(errors[0]) if errors else out.set_result([f.result() for f in futs])

        for f in futs:
            f.add_done_callback(done)
        return out

    def observe(self, on: bool) -> None:
        self._observing = bool(on)

    def close(self) -> None:
        self._closing = True
        self._stop.set()                        # back-offs end; a start under way is closed when done
        for t in list(self._restarting.values()):
            t.join()
        with concurrent.futures.ThreadPoolExecutor(max(len(self.cores), 1)) as pool:
            list(pool.map(lambda c: c.close(), self.cores))

    # -- routing --
    def _token_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            try:
                return list(self.tokenizer.encode(prompt))
            except Exception:                    # routing only: an unroutable prompt has no prefix
                return []
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return []

    def _dispatch(self, rid: str, r: _Routed, outer: concurrent.futures.Future) -> None:
        """Route r (to a replica it has not tried) and add it there; outer gets the verdict."""
        with self._lock:
            if self._req.get(rid) is not r:      # aborted meanwhile
                _settle(outer, result=rid)
                return
            try:
                i = self.router.choose(r.route, self.views(exclude=r.tried))
            except NoReplicaAlive:
                self._req.pop(rid, None)
                tried = f" (tried replicas {sorted(r.tried)})" if r.tried else ""
                _settle(outer, error=EngineDeadError(f"no live replica can take request {rid!r}{tried}"))
                return
            if r.tried:
                self.stats["retried"][i] += 1
            r.replica, r.accepted = i, False
            r.tried.add(i)
            self._set_state(r, "waiting")
            self.stats["routed"][i] += 1
            if self._hashes is not None:
                self._hashes[i].add(prompt_hashes(r.route, self.block_size))
        inner = self.cores[i].add(rid, r.prompt, r.params, r.fields)
        inner.add_done_callback(lambda f: self._added(rid, r, i, f, outer))

    def _added(self, rid: str, r: _Routed, i: int, f: concurrent.futures.Future,
               outer: concurrent.futures.Future) -> None:
        error = f.exception() if not f.cancelled() else EngineDeadError("the add was cancelled")
        if error is None:
            with self._lock:
                r.accepted = True
                gone = self._req.get(rid) is not r   # aborted (or failed) while the add was on its way
            if gone:
                self.cores[i].abort([rid])           # the replica took it after the abort went by
            _settle(outer, result=f.result())
            return
        retry = False
        with self._lock:
            if r.replica == i:
                self._uncount(r)
            if isinstance(error, EngineDeadError) and self._req.get(rid) is r:
                retry = True                     # its replica died (or was lost) before taking it
            else:
                self._req.pop(rid, None) if self._req.get(rid) is r else None
        if retry:
            self._dispatch(rid, r, outer)
        else:
            _settle(outer, error=error)

    # -- what the cores call (their threads) --
    def _callbacks(self, i: int) -> tuple[OnOutputs, OnError]:
        """Replica i's (on_outputs, on_error) for its next core: bound to that core's generation."""
        return (functools.partial(self._outputs, i, gen=self._gen[i]),
                functools.partial(self._error, i, gen=self._gen[i]))

    def _outputs(self, i: int, outputs: list[Any], records: list[Any], *, gen: int = 0) -> None:
        forward = []
        with self._lock:
            if gen != self._gen[i]:              # a replaced core's late output
                return
            for out in outputs:
                r = self._req.get(out.request_id)
                if r is None or r.replica != i:  # aborted, or from a replica it has left
                    continue
                if r.state == "waiting" and (out.finished or any(c.token_ids or c.text for c in out.outputs)):
                    self._set_state(r, "running")
                    r.prompt = r.params = None   # streamed: never retried, so not kept
                if out.finished:
                    self._uncount(r)
                    del self._req[out.request_id]
                forward.append(out)
            if records:
                self._last[i] = records[-1]
                self.stats["steps"][i] += len(records)
            totals = [self._total(rec) for rec in records] if self._observing else []
        self._on_outputs(forward, totals)

    def _error(self, i: int, error: BaseException, request_ids: list[str] | None = None, *,
               gen: int = 0) -> None:
        if not self.cores or self._closing or gen != self._gen[i]:   # starting, shutdown, a replaced core
            return
        died = request_ids is None and not self.cores[i].alive
        retry: list[tuple[str, _Routed]] = []
        failed: list[str] = []
        with self._lock:
            if died:
                self.stats["deaths"][i] += 1
                self._last[i] = None             # its last step leaves the fleet's gauges
                if self._hashes is not None:     # and it comes back cold (a restart, Ray's too)
                    self._hashes[i] = RecentHashes(self._hashes[i].capacity)
                log.error("replica %d died (%r); routing around it", i, error)
                self._schedule_restart(i)
            mine = [rid for rid, r in self._req.items() if r.replica == i]
            for rid in mine if request_ids is None else [x for x in request_ids if x in mine]:
                r = self._req[rid]
                if died and not r.accepted:
                    continue                     # its add's failure reroutes it (_added)
                self._uncount(r)
                if died and r.prompt is not None:
                    retry.append((rid, r))
                else:
                    del self._req[rid]
                    failed.append(rid)
            self.stats["failed"][i] += len(failed)
        for rid, r in retry:
            again: concurrent.futures.Future = concurrent.futures.Future()
            again.add_done_callback(functools.partial(self._retry_done, rid))
            self._dispatch(rid, r, again)
        if failed:
            if died:
                error = ReplicaDiedError(f"replica {i} died while these requests were streaming "
                                         f"({error}); their output so far is all there is")
            self._on_error(error, failed)
        if not self.alive and not self._closing:
            self.error = EngineDeadError(f"every replica has stopped (the last: {error})")
            self._on_error(self.error, None)

    def _retry_done(self, rid: str, f: concurrent.futures.Future) -> None:
        if f.exception() is not None:
            self._on_error(f.exception(), [rid])

    # -- restarts (the supervisor) --
    def _schedule_restart(self, i: int) -> None:
        """Start a supervisor for dead replica i if it may be restarted (under the lock)."""
        if self.cores[i].restarts_itself:                        # its own restarts, its own bound
            if not self._closing and i not in self._restarting:
                t = threading.Thread(target=self._await_own_restart, args=(i, self.cores[i]),
                                     name=f"toolkit-replica-restart-{i}", daemon=True)
                self._restarting[i] = t
                t.start()
            return
        if self._closing or i in self._restarting or self._attempts[i] >= self.max_restarts:
            if self._attempts[i] >= self.max_restarts and self.max_restarts:
                log.error("replica %d has used its %d restarts; it stays dead", i, self.max_restarts)
            return
        t = threading.Thread(target=self._supervise, args=(i,), name=f"toolkit-replica-restart-{i}", daemon=True)
        self._restarting[i] = t
        t.start()

    def _await_own_restart(self, i: int, core: Any) -> None:
        """Wait while replica i's core restarts itself (Ray's actor restart); it comes back
        under the same callbacks, empty and cold (its gauges and prefixes went at its death)."""
        back = None
        while back is None and not self._stop.is_set():
            back = core.wait_restart(0.2)
        self._restart_over(i, "will not be restarted")

    def _restart_over(self, i: int, why: str) -> None:
        """Replica i's restart is over, back or not: the set ends if no replica is left."""
        with self._lock:
            self._restarting.pop(i, None)
            end_set = not self._closing and not self.alive
        if end_set:
            self.error = EngineDeadError(f"every replica has stopped (replica {i} {why})")
            self._on_error(self.error, None)

    def _supervise(self, i: int) -> None:
        """Close dead replica i's core, then start a fresh one (back-off between attempts)."""
        with self._lock:
            self._gen[i] += 1                    # the dead core's callbacks are stale from here
            old = self.cores[i]
        try:
            old.close()                          # its process reaped, its pipe and reader gone
        except Exception:
            log.exception("closing dead replica %d failed", i)
        while not self._closing and self._attempts[i] < self.max_restarts:
            delay = min(self.restart_backoff * 2 ** self._attempts[i], 30.0)
            self._attempts[i] += 1
            if self._stop.wait(delay):
                break
            with self._lock:
                self._gen[i] += 1                # a failed attempt's callbacks are stale too
                callbacks = self._callbacks(i)
            started, core = time.monotonic(), None
            try:
                core = self.factories[i](*callbacks)
                core.observe(True)
            except Exception as e:
                log.error("restarting replica %d failed (attempt %d of %d): %r",
                          i, self._attempts[i], self.max_restarts, e)
                _close_quietly(core)
                continue
            with self._lock:
                # a core that died before it was put in place had its death seen as the
                # old core's (no restart scheduled: this one runs): another attempt
                installed = not self._closing and core.alive
                if installed:
                    self.cores[i] = core
                    self._last[i] = None
                    if self._hashes is not None:
                        self._hashes[i] = RecentHashes(self._hashes[i].capacity)   # a cold prefix cache
                    self.stats["restarts"][i] += 1
            if installed:
                log.warning("replica %d is back (restart %d of %d, %.1f s to start)",
                            i, self._attempts[i], self.max_restarts, time.monotonic() - started)
                break
            _close_quietly(core)                 # the set is closing, or the new core died already
        self._restart_over(i, "could not be restarted")

    # -- bookkeeping (under the lock) --
    def _set_state(self, r: _Routed, state: str) -> None:
        self._uncount(r)
        r.state = state
        self._count[state][r.replica] += 1

    def _uncount(self, r: _Routed) -> None:
        if r.state is not None:
            self._count[r.state][r.replica] -= 1
            r.state = None

    def _total(self, rec: Any) -> Any:
        """A step record of one replica with the fleet's totals (what /metrics' gauges show)."""
        last = [x for x in self._last if x is not None]
        return dataclasses.replace(
            rec, num_running=sum(x.num_running for x in last), num_waiting=sum(x.num_waiting for x in last),
            kv_blocks_used=sum(x.kv_blocks_used for x in last),
            kv_blocks_cached=sum(x.kv_blocks_cached for x in last),
            kv_blocks_total=sum(x.kv_blocks_total for x in last))


def _close_quietly(core: Any) -> None:
    if core is None:
        return
    try:
        core.close()
    except Exception:
        log.exception("closing a replica's core failed")


def _settle(fut: concurrent.futures.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future unless its caller gave up on it (cancelled)."""
    if fut.done() or not fut.set_running_or_notify_cancel():
        return
    fut.set_exception(error) if error is not None else fut.set_result(result)
