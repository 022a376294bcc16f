"""RayCore: an engine replica as a Ray actor, behind the core interface (the data-parallel
backend "ray"; `pip install toolkit[ray]`). Ray is imported here only, when a Ray replica
set is built.

    front (RayCore, reader thread)  ── actor.poll() ──▶  _EngineActor (any node of the cluster)
                                                          LLM + ThreadCore: the step loop
    add / abort / call             ── actor methods ─▶   deltas + step records, buffered

The actor runs the engine loop on a thread of its own (a ThreadCore) and buffers each step's
deltas (DeltaTracker: only new text and tokens) and step records; the reader long-polls
them and turns the deltas back into cumulative outputs (Accumulator), as ProcessCore does
over its pipe. The actor is threaded (max_concurrency) so a poll waits while adds run.

A lost actor (its process or node died) makes the core not alive: every request on it is
reported (the replica set retries those that streamed nothing). Ray restarts the actor
(max_restarts), which builds the engine again; the reader waits for it and the core is
alive again, empty. With the restarts spent the core stays dead. The core declares
`restarts_itself`, and `wait_restart` tells the replica set how the restart went, so the
set counts a replica Ray is restarting as coming back (not as dead for good).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable

from toolkit.entrypoints.core_thread import EngineDeadError, OnError, OnOutputs
from toolkit.entrypoints.streams import Accumulator, DeltaTracker

log = logging.getLogger(__name__)


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("the ray data-parallel backend needs Ray: pip install -e '.[ray]' "
                          "(or pip install 'ray[serve]')") from e
    return ray


class _EngineActor:
    """The replica inside its actor: an LLM stepped by a ThreadCore, outputs buffered for poll()."""

    def __init__(self, model: Any, options: dict[str, Any]) -> None:
        from toolkit.entrypoints.core_thread import ThreadCore
        from toolkit.entrypoints.llm import LLM

        self._cond = threading.Condition()
        self._deltas: list[Any] = []
        self._records: list[Any] = []
        self._errors: list[tuple[str, list[str] | None]] = []
        self._trackers: dict[str, DeltaTracker] = {}
        self.core = ThreadCore(LLM(model, **options), self._on_outputs, self._on_error)
        self.core.observe(True)

    def info(self) -> dict[str, Any]:
        return dict(tokenizer=self.core.tokenizer, max_model_len=self.core.max_model_len,
                    vocab_size=self.core.vocab_size)

    def add(self, request_id: str, prompt: Any, params: Any, fields: dict[str, Any]) -> str:
        with self._cond:
            self._trackers[request_id] = DeltaTracker()
        try:
            self.core.add(request_id, prompt, params, fields).result()
        except BaseException:
            with self._cond:
                self._trackers.pop(request_id, None)
            raise
        return request_id

    def abort(self, request_ids: list[str]) -> None:
        with self._cond:
            for rid in request_ids:
                self._trackers.pop(rid, None)
        self.core.abort(list(request_ids))

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return self.core.call(fn).result()

    def poll(self, timeout: float) -> tuple[list[Any], list[Any], list[tuple[str, list[str] | None]]]:
        """What the loop produced since the last poll (waits up to `timeout` s for something)."""
        with self._cond:
            if not (self._deltas or self._records or self._errors):
                self._cond.wait(timeout)
            out = (self._deltas, self._records, self._errors)
            self._deltas, self._records, self._errors = [], [], []
        return out

    def _on_outputs(self, outputs: list[Any], records: list[Any]) -> None:
        with self._cond:
            for o in outputs:
                t = self._trackers.get(o.request_id)
                d = None if t is None else t.delta(o)
                if d is not None:
                    self._deltas.append(d)
                if o.finished:
                    self._trackers.pop(o.request_id, None)
            self._records += [dataclasses.replace(r, scheduler_output=None) for r in records]
            self._cond.notify_all()

    def _on_error(self, error: BaseException, request_ids: list[str] | None = None) -> None:
        with self._cond:
            for rid in list(self._trackers) if request_ids is None else request_ids:
                self._trackers.pop(rid, None)
            self._errors.append((str(error), request_ids))
            self._cond.notify_all()


class RayCore:
    restarts_itself = True          # Ray restarts a lost actor; the replica set waits, not rebuilds

    def __init__(self, model: Any, options: dict[str, Any], on_outputs: OnOutputs, on_error: OnError, *,
                 name: str = "toolkit-replica", num_gpus: float = 0, num_cpus: float = 1,
                 max_restarts: int = 1, startup_timeout: float = 1800.0, poll_timeout: float = 0.05,
                 actor_options: dict[str, Any] | None = None) -> None:
        ray = self._ray = _ray()
        cls = ray.remote(_EngineActor).options(
            name=None, num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0,
            max_concurrency=8, **(actor_options or {}))
        self.actor = cls.remote(model, options)
        self.name = name
        try:
            info = ray.get(self.actor.info.remote(), timeout=startup_timeout)
        except Exception as e:
            ray.kill(self.actor, no_restart=True)
            raise EngineDeadError(f"the Ray replica {name} failed to start: {e}") from e
        self.tokenizer = info["tokenizer"]
        self.max_model_len, self.vocab_size = info["max_model_len"], info["vocab_size"]
        self._on_outputs, self._on_error = on_outputs, on_error
        self._acc: dict[str, Accumulator] = {}
        self._poll_timeout = poll_timeout
        self._lost = False
        self._closing = False
        self._restart: concurrent.futures.Future | None = None   # since the last loss: back or not
        self.error: BaseException | None = None
        self.restarts = 0
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return not self._lost and not self._closing and self._reader.is_alive()

    # -- what the front calls --
    def add(self, request_id: str, prompt: Any, params: Any, fields: dict[str, Any]) -> concurrent.futures.Future:
        if not self.alive:
            return _failed(EngineDeadError(f"the Ray replica {self.name} is not running"))
        self._acc[request_id] = Accumulator()
        fut = self._future(self.actor.add.remote(request_id, prompt, params, fields))
        fut.add_done_callback(lambda f: f.exception() is not None and self._acc.pop(request_id, None))
        return fut

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._acc.pop(rid, None)
        if self.alive:
            self.actor.abort.remote(list(request_ids))

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        if not self.alive:
            return _failed(EngineDeadError(f"the Ray replica {self.name} is not running"))
        return self._future(self.actor.call.remote(fn))

    def wait_restart(self, timeout: float) -> bool | None:
        """After a loss: True once Ray's restart is back, False if none will come (restarts
        spent, or closing), None if still waiting after `timeout` s. True when never lost."""
        pending = self._restart
        if pending is None:
            return not self._closing
        try:
            return pending.result(timeout)
        except concurrent.futures.TimeoutError:
            return None

    def observe(self, on: bool) -> None:
        pass                         # the actor always keeps step records; the replica set reads them

    def close(self) -> None:
        self._closing = True
        _settle(self._restart, False)
        self._reader.join(10)
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:            # already gone
            pass

    # -- plumbing --
    def _future(self, ref: Any) -> concurrent.futures.Future:
        """A Future of the actor call's result; a lost actor's failure as EngineDeadError."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        inner = ref.future()

        def done(f: concurrent.futures.Future) -> None:
            e = f.exception()
            if e is None:
                out.set_result(f.result())
            elif isinstance(e, self._ray.exceptions.RayActorError):
                out.set_exception(EngineDeadError(f"the Ray replica {self.name} was lost: {e}"))
            else:
                out.set_exception(getattr(e, "cause", None) or e)

        inner.add_done_callback(done)
        return out

    def _read(self) -> None:
        ray = self._ray
        while not self._closing:
            try:
                deltas, records, errors = ray.get(self.actor.poll.remote(self._poll_timeout))
            except ray.exceptions.RayActorError as e:
                self._lost_actor(e)
                back = self._wait_restart()
                _settle(self._restart, back)
                if not back:
                    return
                continue
            except Exception:
                if self._closing:
                    return
                log.exception("polling the Ray replica %s failed", self.name)
                time.sleep(self._poll_timeout)
                continue
            outputs = []
            for d in deltas:
                acc = self._acc.get(d.request_id)
                if acc is None:
                    continue
                outputs.append(acc.update(d))
                if d.finished:
                    del self._acc[d.request_id]
            if outputs or records:
                self._on_outputs(outputs, records)
            for msg, rids in errors:
                for rid in list(self._acc) if rids is None else rids:
                    self._acc.pop(rid, None)
                self._on_error(RuntimeError(msg), rids)

    def _lost_actor(self, e: BaseException) -> None:
        self._restart = concurrent.futures.Future()          # before the set hears of the loss
        self._lost = True
        self._acc.clear()
        self.error = EngineDeadError(f"the Ray replica {self.name} was lost: {e}")
        log.error("%s", self.error)
        self._on_error(self.error)

    def _wait_restart(self) -> bool:
        """Wait for Ray to restart the actor (its engine rebuilt); False if it will not come back.
        A call to a restarting actor waits in its queue; one to a dead actor (restarts spent,
        or killed for good) fails with ActorDiedError. The state API, where the cluster runs
        it, says DEAD outright; without it, three such failures in a row, 0.5 s apart, do."""
        ray = self._ray
        died = 0
        while not self._closing:
            try:
                ray.get(self.actor.info.remote(), timeout=60)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayActorError as e:
                unavailable = isinstance(e, getattr(ray.exceptions, "ActorUnavailableError", ()))
                died = 0 if unavailable else died + 1
                spent = _restarts_spent(self.actor)
                if spent or (spent is None and died >= 3):
                    return False
                time.sleep(0.5 if died else 0.2)
                continue
            self.restarts += 1
            self._lost, self.error = False, None
            log.warning("the Ray replica %s is back (restart %d)", self.name, self.restarts)
            return True
        return False


def _restarts_spent(actor: Any) -> bool | None:
    """Whether Ray's state API says the actor is DEAD; None where that API does not answer
    (a cluster without the dashboard)."""
    try:
        from ray.util.state import get_actor

        state = get_actor(actor._actor_id.hex())
    except Exception:
        return None
    return state is None or state.state == "DEAD"


def _settle(f: concurrent.futures.Future | None, result: Any) -> None:
    if f is not None and not f.done():
        try:
            f.set_result(result)
        except concurrent.futures.InvalidStateError:      # settled by the other thread meanwhile
            pass


def _failed(error: BaseException) -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_exception(error)
    return f


def ray_factories(model: Any, options: dict[str, Any], n: int, *, address: str | None = None,
                  num_gpus: float | None = None, num_cpus: float = 1, max_restarts: int = 1,
                  init_options: dict[str, Any] | None = None, **core_options: Any) -> list[Callable]:
    """n replica factories (on_outputs, on_error) -> RayCore; connects to (or starts) a Ray
    cluster first. num_gpus per replica: default tensor_parallel_size when the cluster has
    GPUs, else 0."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, **(init_options or {}))
    if num_gpus is None:
        num_gpus = float(options.get("tensor_parallel_size", 1) or 1) if ray.cluster_resources().get("GPU") else 0
    return [functools.partial(_make_core, model, options, name=f"toolkit-replica-{r}", num_gpus=num_gpus,
                              num_cpus=num_cpus, max_restarts=max_restarts, **core_options)
            for r in range(n)]


def _make_core(model: Any, options: dict[str, Any], on_outputs: OnOutputs, on_error: OnError, **kw: Any) -> RayCore:
    return RayCore(model, options, on_outputs, on_error, **kw)
