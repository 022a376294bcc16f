"""ProcessCore: the engine's step loop in a process of its own, so the server's Python
work (HTTP, JSON, the readers) does not share a GIL with the engine's host work.

    parent (server)                              child (engine)
    add / abort / call / observe  ── pipe ──▶    commands between steps
    reader thread  ◀── pipe ──  ("out", deltas, step records) after every step

The child builds the LLM itself (CUDA is initialised there, never in the parent; the
start method is spawn) and sends back, once, what the parent needs to prepare requests:
the tokenizer, max_model_len, the vocabulary size. After each step it sends each changed
request's delta (DeltaTracker: only new text, token ids, logprobs), which the reader
thread turns back into cumulative outputs (Accumulator) for the streams. A child that
dies ends every stream and pending call with EngineDeadError; nothing waits forever.
Functions given to `call` must be picklable (module-level functions).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import itertools
import logging
import multiprocessing
import os
import sys
import threading
import time
from typing import Any, Callable

from toolkit.entrypoints.core_thread import EngineDeadError, OnError, OnOutputs, faulty_requests, step_error
from toolkit.entrypoints.streams import Accumulator, DeltaTracker

log = logging.getLogger(__name__)


class ProcessCore:
    restarts_itself = False         # a replica set starts a dead one again

    def __init__(self, args: tuple, kwargs: dict[str, Any], on_outputs: OnOutputs, on_error: OnError,
                 *, startup_timeout: float = 1800.0, env: dict[str, str] | None = None,
                 name: str = "toolkit-engine") -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        # env: variables the child sets before it builds the engine (a data-parallel
        # replica's CUDA_VISIBLE_DEVICES); this process's environment is left alone
        self.proc = ctx.Process(target=_child_main, args=(child, args, kwargs, env), daemon=True,
                                name=name)
        self.proc.start()
        child.close()
        if not self._conn.poll(startup_timeout):
            self.proc.kill()
            raise EngineDeadError(f"the engine process did not start within {startup_timeout} s")
        try:
            kind, info = self._conn.recv()
        except EOFError:
            raise EngineDeadError(f"the engine process exited while starting (code "
                                  f"{self.proc.join(5) or self.proc.exitcode})") from None
        if kind != "ready":
            self.proc.join(10)
            raise EngineDeadError(f"the engine process failed to start: {info}")
        self.tokenizer = info["tokenizer"]
        self.max_model_len, self.vocab_size = info["max_model_len"], info["vocab_size"]
        self._on_outputs, self._on_error = on_outputs, on_error
        self._send_lock = threading.Lock()
        # command id -> (its future, the request id of an add): a refused add drops its
        # accumulator when the reply comes
        self._futures: dict[int, tuple[concurrent.futures.Future, str | None]] = {}
        self._cids = itertools.count()
        self._acc: dict[str, Accumulator] = {}
        self._closing = False
        self.error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="toolkit-engine-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._reader.is_alive() and self.proc.is_alive() and not self._closing

    # -- what the front calls (any thread) --
    def add(self, request_id: str, prompt: Any, params: Any, fields: dict[str, Any]
            ) -> concurrent.futures.Future:
        self._acc[request_id] = Accumulator()
        return self._request("add", request_id, prompt, params, fields, rid=request_id)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._acc.pop(rid, None)
        self._send(("abort", None, request_ids))

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        return self._request("call", fn)

    def observe(self, on: bool) -> None:
        self._send(("observe", None, on))

    def close(self) -> None:
        self._closing = True
        try:
            self._send(("stop", None))
        except (EngineDeadError, OSError):
            pass
        self.proc.join(60)
        if self.proc.is_alive():
            log.warning("the engine process did not stop within 60 s; killing it")
            self.proc.kill()
            self.proc.join(10)
        self._reader.join(10)
        self._conn.close()

    # -- plumbing --
    def _request(self, kind: str, *payload: Any, rid: str | None = None) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        cid = next(self._cids)
        self._futures[cid] = (fut, rid)
        try:
            self._send((kind, cid, *payload))
        except Exception as e:
            self._futures.pop(cid, None)
            if rid is not None:
                self._acc.pop(rid, None)
            fut.set_exception(e if isinstance(e, EngineDeadError) else
                              EngineDeadError(f"could not send to the engine process: {e!r}"))
        return fut

    def _send(self, msg: tuple) -> None:
        if not self.proc.is_alive():
            raise EngineDeadError(f"the engine process is not running (exit code {self.proc.exitcode})")
        with self._send_lock:
            self._conn.send(msg)

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "stopped":
                    return
                try:
                    self._handle(msg)
                except Exception:                     # one message's fault must not end the reader
                    log.exception("the engine reader could not handle a %r message", msg[0])
        except (EOFError, OSError):
            pass
        finally:
            code = self.proc.join(5) or self.proc.exitcode
            if not self._closing:
                self.error = EngineDeadError(f"the engine process exited unexpectedly (exit code {code})")
                log.error("%s", self.error)
            err = self.error or EngineDeadError("the engine process stopped")
            for fut, _ in list(self._futures.values()):
                if not fut.done():
                    fut.set_exception(err)
            self._futures.clear()
            self._on_error(err)


    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            outputs = []
            for d in msg[1]:
                acc = self._acc.get(d.request_id)
                if acc is None:               # aborted meanwhile
                    continue
                outputs.append(acc.update(d))
                if d.finished:
                    del self._acc[d.request_id]
            self._on_outputs(outputs, msg[2])
        elif kind == "reply":
            _, cid, ok, value = msg
            fut, rid = self._futures.pop(cid, (None, None))
            if rid is not None and not ok:
                self._acc.pop(rid, None)      # refused: no output will ever come for it
            # a caller that gave up (asyncio cancelled the wrapped future) gets nothing;
            # setting a cancelled future raises InvalidStateError
            if fut is None or not fut.set_running_or_notify_cancel():
                return
            fut.set_result(value) if ok else fut.set_exception(value)
        elif kind == "error":                 # (message, the request ids it ends: None = all)
            rids = msg[2]
            if rids is None:
                self._acc.clear()
            for rid in rids or ():
                self._acc.pop(rid, None)
            self._on_error(RuntimeError(msg[1]), rids)


def _child_main(conn, args: tuple, kwargs: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """The engine process: build the LLM, then serve commands and step until told to stop."""
    os.environ.update(env or {})
    from toolkit.entrypoints.llm import LLM

    try:
        llm = LLM(*args, **kwargs)
    except BaseException as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    engine = llm.engine
    # this process lives for the engine alone: what start-up built is never garbage, so the
    # collector's full passes skip it for good (see engine/gc_freeze.py; vLLM does the same)
    gc.collect()
    gc.freeze()
    conn.send(("ready", dict(tokenizer=engine.tokenizer, max_model_len=engine.max_model_len,
                             vocab_size=engine.model.spec.vocab_size)))
    trackers: dict[str, _Tracker] = {}
    records: list[Any] = []
    observing = False

    def record(rec: Any) -> None:
        records.append(dataclasses.replace(rec, scheduler_output=None)
                       if hasattr(rec, "scheduler_output") else rec)

    def handle(msg: tuple) -> bool:
        """Run one command; False when told to stop."""
        nonlocal observing
        kind, cid = msg[0], msg[1]
        try:
            if kind == "add":
                rid, prompt, params, fields = msg[2:]
                engine.add_request(prompt, params, request_id=rid, **fields)
                trackers[rid] = _Tracker()
                result = rid
            elif kind == "abort":
                engine.abort(msg[2])
                for rid in msg[2]:
                    trackers.pop(rid, None)
                return True
            elif kind == "call":
                result = msg[2](engine)
            elif kind == "observe":
                if msg[2] and not observing:
                    engine.add_observer(record)
                elif not msg[2] and observing:
                    engine.remove_observer(record)
                observing = bool(msg[2])
                return True
            elif kind == "stop":
                return False
            else:
                raise ValueError(f"unknown command {kind!r}")
        except BaseException as e:               # the caller gets it; the loop goes on
            _reply(conn, cid, False, e)
            return True
        _reply(conn, cid, True, result)
        return True

    try:
        while True:
            busy = engine.has_unfinished()
            if not busy:
                conn.poll(None)                  # idle: sleep until a command comes
            while conn.poll(0):
                if not handle(conn.recv()):
                    engine.abort(engine.request_ids())
                    return
            if not engine.has_unfinished():
                continue
            try:
                outputs = engine.step()
            except Exception as e:
                rids = faulty_requests(engine, e)   # None: the whole step's requests
                engine.abort(engine.request_ids() if rids is None else rids)
                for rid in trackers.copy() if rids is None else rids:
                    trackers.pop(rid, None)
                conn.send(("error", str(step_error(e)), rids))
                continue
            deltas = []
            for o in outputs:
                t = trackers.get(o.request_id)
                d = None if t is None else t.delta(o)
                if d is None:
                    continue
                if not d.finished:               # the prompt crosses once, with the first delta
                    if t.sent_prompt:
                        d.prompt_token_ids, d.prompt = [], None
                    t.sent_prompt = True
                deltas.append(d)
                if o.finished:
                    del trackers[o.request_id]
            conn.send(("out", deltas, records[:]))
            records.clear()
            if not outputs and not engine.scheduler.has_unfinished():
                time.sleep(0.001)                # only grammars compiling: do not spin
    except (EOFError, OSError, BrokenPipeError):
        pass                                     # the parent went away
    finally:
        llm.close()
        try:
            conn.send(("stopped",))
        except Exception:
            pass
        # skip interpreter teardown: a library's worker thread must not keep a finished
        # engine process alive (seen on the GPU: a clean exit took over a minute)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _Tracker(DeltaTracker):
    sent_prompt = False          # the prompt went with an earlier delta


def _reply(conn, cid: int | None, ok: bool, value: Any) -> None:
    if cid is None:
        return
    try:
        conn.send(("reply", cid, ok, value))
    except Exception as e:                       # an unpicklable result or exception
        conn.send(("reply", cid, False, RuntimeError(f"{type(value).__name__}: {value} "
                                                     f"(could not be sent back: {e})")))
