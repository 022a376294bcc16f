"""ThreadCore: an Engine's step loop on a background thread of this process.

The Engine is not thread-safe, so this thread runs every engine call: commands posted by
other threads (add, abort, a function of the engine) run between two steps. The loop
sleeps when there is no work; it never steps an empty batch.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable

from toolkit.engine.gc_freeze import frozen_heap
from toolkit.types import RequestFault, RequestOutput

log = logging.getLogger(__name__)

OnOutputs = Callable[[list[RequestOutput], list[Any]], None]
OnError = Callable[..., None]       # (error, request ids it ends: None = all)


def faulty_requests(engine: Any, error: BaseException) -> list[str] | None:
    """The user requests a failed step is attributed to (a RequestFault's), or None: all."""
    if not isinstance(error, RequestFault):
        return None
    op = engine.output_processor
    return list(dict.fromkeys(op.group_of(s) or s for s in error.request_ids))


def step_error(error: BaseException) -> RuntimeError:
    """What a failed step's streams end with: the message, with the type of an unexpected error."""
    if isinstance(error, RequestFault):
        return error
    return RuntimeError(f"an engine step failed: {type(error).__name__}: {error}")


class EngineDeadError(RuntimeError):
    """The engine loop is gone (shut down, its process exited, or an error it could not
    recover from)."""


class ThreadCore:
    restarts_itself = False         # a replica set starts a dead one again

    def __init__(self, engine: Any, on_outputs: OnOutputs, on_error: OnError) -> None:
        self.llm = engine if hasattr(engine, "engine") and hasattr(engine, "generate") else None
        self.engine = engine.engine if self.llm is not None else engine
        if self.engine is None:
            raise ValueError("this LLM is closed; build a new one to serve")
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.model.spec.vocab_size
        self._on_outputs, self._on_error = on_outputs, on_error
        self._commands: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._records: list[Any] | None = None      # step records, while someone observes
        self.error: BaseException | None = None
        self.num_steps = 0
        self._thread = threading.Thread(target=self._loop, name="toolkit-engine-loop", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    # -- what the front calls (any thread) --
    def add(self, request_id: str, prompt: Any, params: Any, fields: dict[str, Any]
            ) -> concurrent.futures.Future:
        return self._call(lambda: self.engine.add_request(prompt, params, request_id=request_id, **fields))

    def abort(self, request_ids: list[str]) -> None:
        if self._thread.is_alive():
            self._call(lambda: self.engine.abort(request_ids))

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        return self._call(lambda: fn(self.engine))

    def observe(self, on: bool) -> None:
        """Collect step records (handed to on_outputs with each step's outputs)."""
        def switch() -> None:
            if on and self._records is None:
                self._records = []
                self.engine.add_observer(self._record)
            elif not on and self._records is not None:
                self.engine.remove_observer(self._record)
                self._records = None
        self._call(switch)

    def close(self) -> None:
        if self._thread.is_alive():
            done = self._call(lambda: self.engine.abort(list(self._unfinished())))
            try:
                done.result(timeout=60)
            except Exception:                      # the loop died meanwhile: nothing to abort
                pass
            self._stop = True
            self._wake.set()
            self._thread.join(timeout=60)
        if self.llm is not None:
            self.llm.close()
        elif not getattr(self.engine, "closed", True):
            self.engine.close()

    # -- the loop thread --
    def _record(self, rec: Any) -> None:
        if self._records is not None:
            self._records.append(rec)

    def _unfinished(self) -> list[str]:
        return self.engine.request_ids()

    def _call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self._thread.is_alive():
            fut.set_exception(EngineDeadError("the engine loop is not running"
                                              + (f" (it stopped on: {self.error!r})" if self.error else "")))
            return fut
        with self._lock:
            self._commands.append((fn, fut))
        self._wake.set()
        return fut

    def _run_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for fn, fut in commands:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:             # the caller gets it; the loop goes on
                fut.set_exception(e)

    def _loop(self) -> None:
        try:
            # the heap frozen for the loop's life, as LLM.generate does (engine/gc_freeze.py):
            # no full collector pass over the model's objects pauses a step of a served request
            with frozen_heap():
                while not self._stop:
                    self._run_commands()
                    if self._stop:
                        break
                    if not self.engine.has_unfinished():
                        self._wake.wait()
                        self._wake.clear()
                        continue
                    self._step()
        except BaseException as e:                 # a bug in the loop, or a step and its abort failed
            log.exception("the engine loop stopped")
            self.error = e
            self._stop = True                      # before the report: its reader sees a dead core
            self._on_error(EngineDeadError(f"the engine loop stopped: {e!r}"))
        finally:
            self._stop = True
            self._run_commands()                   # callers waiting on a command get an answer

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # a fault of some requests alone (RequestFault) ends only them; otherwise the
            # requests of a step that raised cannot be trusted: the front ends them all with
            # the error (and aborts them); the engine goes on serving
            rids = faulty_requests(self.engine, e)
            log.exception("an engine step failed; %s end with the error",
                          "its requests" if rids is None else f"requests {rids}")
            self.engine.abort(self._unfinished() if rids is None else rids)
            self._on_error(step_error(e), rids)
            return
        self.num_steps += 1
        records, self._records = self._records, [] if self._records is not None else None
        self._on_outputs(outputs, records or [])
        if not outputs and not self.engine.scheduler.has_unfinished():
            time.sleep(0.001)   # only grammars compiling elsewhere: do not spin on them
