"""AsyncEngine: an Engine's step loop on a background thread, for servers.

    engine = AsyncEngine(LLM(...))                 # or AsyncEngine.build(model, **llm_options)
    async for out in engine.generate("Hello", SamplingParams(max_tokens=32)):
        print(out.outputs[0].text, end="")         # deltas: only what is new since the last one
    await engine.shutdown()

The `Engine` is not thread-safe, so one thread owns it: the loop thread runs every engine
call (add, abort, step) and nobody else touches it. Callers on any thread or event loop
post commands to it; `add` waits for the engine's verdict, so bad input raises at the
caller. Each request gets a stream that holds the request's latest (cumulative) output;
the consumer turns it into a delta when it reads. A slow consumer therefore never makes
a queue grow: the steps it missed merge into one delta. Text in a delta never has to be
taken back (the output processor holds back a tail that could still become a stop
string). Cancelling or closing the consumer (a client that went away) aborts the request
and frees its KV blocks. The loop sleeps when there is no work: it never spins on an
empty batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from typing import Any, AsyncIterator, Callable, Literal, Sequence

from toolkit.types import CompletionOutput, RequestOutput, SamplingParams

log = logging.getLogger(__name__)

OutputKind = Literal["delta", "cumulative", "final"]


class EngineDeadError(RuntimeError):
    """The loop thread is gone (shut down, or an error it could not recover from)."""


class AsyncEngine:
    """Runs `engine.step()` on a background thread; any thread or asyncio task may add,
    stream and abort requests. `engine` is an `Engine` or an `LLM` (its engine is taken)."""

    def __init__(self, engine: Any, *, max_pending: int | None = None) -> None:
        self.llm = engine if hasattr(engine, "engine") and hasattr(engine, "generate") else None
        self.engine = engine.engine if self.llm is not None else engine
        if self.engine is None:
            raise ValueError("this LLM is closed; build a new one to serve")
        if max_pending is not None and (not isinstance(max_pending, int) or max_pending < 1):
            raise ValueError(f"max_pending must be a positive integer or None, got {max_pending!r}")
        self.max_pending = max_pending      # refuse new requests past this many unfinished
        self._commands: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._lock = threading.Lock()       # guards _commands and _streams
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._accepting = True
        self._stop = False
        self.error: BaseException | None = None     # what ended the loop, if it ended badly
        # called on the loop thread with each request's final (cumulative) output, aborts
        # included: metrics, logs
        self.finished_listeners: list[Callable[[RequestOutput], None]] = []
        self.num_steps = 0
        self._thread = threading.Thread(target=self._loop, name="toolkit-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def build(cls, model: Any = None, *, max_pending: int | None = None, **llm_options: Any
              ) -> "AsyncEngine":
        """An LLM built from the same arguments as `LLM(...)`, served by a new AsyncEngine."""
        from toolkit.engine.llm import LLM

        return cls(LLM(model, **llm_options), max_pending=max_pending)

    # -- state a server reads (racy by nature; good enough for backpressure and health) --
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def num_unfinished(self) -> int:
        """User requests added and not yet finished (what backpressure counts)."""
        return len(self._streams)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop

    @property
    def accepting(self) -> bool:
        return self._accepting and self.is_running

    # -- requests --
    def add(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
            request_id: str | None = None, **fields: Any) -> "_Stream":
        """Queue a request from any thread and wait for the engine to take it; returns its
        stream. `fields` are what `Engine.add_request` stores for the scheduling policy
        (priority, client_id, deadline, expected_output_len, arrival_time). Raises what
        `add_request` raises for bad input (nothing is queued then), `Overloaded` past
        `max_pending`, EngineDeadError after shutdown."""
        stream, taken = self._submit(prompt, params, request_id, fields, _running_loop())
        taken.result()
        return stream

    async def add_async(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                        request_id: str | None = None, **fields: Any) -> "_Stream":
        """`add` without blocking the event loop while the engine thread takes it."""
        stream, taken = self._submit(prompt, params, request_id, fields, asyncio.get_running_loop())
        await asyncio.wrap_future(taken)
        return stream

    async def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                       request_id: str | None = None, output_kind: OutputKind = "delta",
                       **fields: Any) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs. "delta": each output holds only what is new since
        the last one (text, token ids, logprobs; completions that did not change left out);
        "cumulative": everything so far; "final": one output at the end. Leaving the loop
        early, or cancelling the task, aborts the request."""
        if output_kind not in ("delta", "cumulative", "final"):
            raise ValueError(f"output_kind must be 'delta', 'cumulative' or 'final', got {output_kind!r}")
        stream = await self.add_async(prompt, params, request_id=request_id, **fields)
        async for out in stream.iterate(output_kind):
            yield out

    def _submit(self, prompt: Any, params: SamplingParams | None, request_id: str | None,
                fields: dict[str, Any], loop: asyncio.AbstractEventLoop | None,
                ) -> tuple["_Stream", concurrent.futures.Future]:
        if not self.accepting:
            raise EngineDeadError("the engine is shutting down or stopped; it takes no new requests"
                                  + (f" (it stopped on: {self.error!r})" if self.error else ""))
        if self.max_pending is not None and self.num_unfinished >= self.max_pending:
            raise Overloaded(f"{self.num_unfinished} requests are pending (max_pending="
                             f"{self.max_pending}); retry later")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        stream = _Stream(rid, loop, abort=self.abort)

        def add() -> str:                          # on the loop thread
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self.engine.add_request(prompt, params, request_id=rid, **fields)
            self._streams[rid] = stream
            return rid

        return stream, self._call(add)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread (no wait); its stream ends with finish reason
        "abort". Unknown or finished ids are ignored."""
        def abort() -> None:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                self.engine.abort(request_id)
                self._finished(stream.finish_aborted())
        if self._thread.is_alive():
            self._call(abort)

    # -- lifecycle --
    async def shutdown(self, timeout: float = 0.0) -> None:
        """Stop taking requests; let running ones finish for up to `timeout` seconds, abort
        the rest, end the loop and free the engine (KV cache, weights)."""
        self._accepting = False
        deadline = time.monotonic() + max(timeout, 0.0)
        while self._streams and time.monotonic() < deadline and self._thread.is_alive():
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Abort what is unfinished, stop the loop thread and close the engine (blocking)."""
        self._accepting = False
        if self._thread.is_alive():
            done = self._call(self._abort_all)
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

    def __enter__(self) -> "AsyncEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the loop thread between two steps (e.g. add an observer, read
        a consistent snapshot); returns a Future of its result."""
        return self._call(lambda: fn(self.engine))

    # -- the loop thread --
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
            while not self._stop:
                self._run_commands()
                if self._stop:
                    break
                if not self.engine.has_unfinished():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._step()
        except BaseException as e:                 # pragma: no cover - a bug in the loop itself
            log.exception("the engine loop stopped")
            self.error = e
            self._fail_all(e)
        finally:
            self._stop = True
            self._run_commands()                   # callers waiting on a command get an answer

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # a step that raised: the requests in it cannot be trusted; end them with the
            # error and keep serving (the engine's own state is consistent after an abort)
            log.exception("an engine step failed; its requests end with the error")
            self._fail_all(e)
            return
        self.num_steps += 1
        woken: list[_Stream] = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.put(out, signal=False)
            woken.append(stream)
            if out.finished:
                del self._streams[out.request_id]
                self._finished(out)
        _signal_all(woken)
        if not outputs and not self.engine.scheduler.has_unfinished():
            time.sleep(0.001)   # only grammars compiling elsewhere: do not spin on them

    def _fail_all(self, error: BaseException) -> None:
        streams, self._streams = self._streams, {}
        try:
            self.engine.abort(list(streams))
        except Exception:                          # pragma: no cover - best effort
            log.exception("abort after a failed step raised")
        for s in streams.values():
            s.fail(error)

    def _abort_all(self) -> None:
        streams, self._streams = self._streams, {}
        self.engine.abort(list(streams))
        for s in streams.values():
            self._finished(s.finish_aborted())

    def _finished(self, out: RequestOutput | None) -> None:
        for listener in list(self.finished_listeners) if out is not None else ():
            try:
                listener(out)
            except Exception:                      # a listener's bug must not stop serving
                log.exception("finished listener %r raised", listener)


class Overloaded(RuntimeError):
    """More requests are pending than the engine was told to accept (max_pending)."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Stream:
    """The outputs of one request, as the loop thread produces them: it keeps only the
    latest cumulative output (a slow reader misses nothing: outputs are cumulative) and
    wakes the reader's event loop."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None,
                 abort: Callable[[str], None] | None = None) -> None:
        self.request_id = request_id
        self.loop = loop
        self._abort = abort
        self._latest: RequestOutput | None = None       # not yet read
        self._last_seen: RequestOutput | None = None    # the latest put, read or not
        self._error: BaseException | None = None
        self._done = False              # the latest output is the last one
        self._event: asyncio.Event | None = None
        self._cond = threading.Condition()   # for readers without an event loop

    # loop thread side
    def put(self, out: RequestOutput, signal: bool = True) -> None:
        """The request's latest output; with signal=False the caller wakes the reader
        (`_signal_all`: one wake-up per event loop for a whole step's outputs)."""
        with self._cond:
            self._latest = self._last_seen = out
            self._done = out.finished
            self._cond.notify_all()
        if signal:
            self._signal()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error, self._done = error, True
            self._cond.notify_all()
        self._signal()

    def finish_aborted(self) -> RequestOutput | None:
        """The request was aborted: a last output with finish reason "abort" (returned;
        None if the stream had already ended)."""
        with self._cond:
            last = self._latest or self._last_seen
            if self._done:
                return None
            comps = [dataclasses.replace(c, finish_reason=c.finish_reason or "abort", new_token_ids=[])
                     for c in (last.outputs if last else [])]
            self._latest = RequestOutput(
                self.request_id, finished=True, finish_reason="abort",
                prompt=last.prompt if last else None,
                prompt_token_ids=last.prompt_token_ids if last else [],
                outputs=comps, metrics=last.metrics if last else None)
            self._done = True
            self._cond.notify_all()
            out = self._latest
        self._signal()
        return out

    def _signal(self) -> None:
        if self.loop is None or self._event is None:
            return
        try:
            self.loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:            # the reader's loop is closed: nobody will read
            if self._abort is not None and not self._done:
                self._abort(self.request_id)

    # reader side
    async def iterate(self, kind: OutputKind = "delta") -> AsyncIterator[RequestOutput]:
        self._event = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        delta = _DeltaTracker()
        finished = False
        try:
            while True:
                with self._cond:
                    latest, self._latest = self._latest, None
                    error, done = self._error, self._done
                if latest is None and error is None:
                    await self._event.wait()
                    self._event.clear()
                    continue
                if error is not None:
                    finished = True
                    raise error
                finished = done
                if kind == "delta":
                    out = delta.delta(latest)
                    if out is not None:
                        yield out
                elif kind == "cumulative" or done:
                    yield latest
                if done:
                    return
        finally:
            if not finished and self._abort is not None:
                self._abort(self.request_id)     # the reader left early: free its blocks

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block the calling thread until the request finishes; its final output."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"request {self.request_id!r} did not finish in {timeout} s")
            if self._error is not None:
                raise self._error
            return self._latest


def _signal_all(streams: list[_Stream]) -> None:
    """Wake the readers of these streams: one call per event loop (each call_soon_threadsafe
    writes to the loop's self-pipe, a system call; a step may update hundreds of streams)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for s in streams:
        if s.loop is None or s._event is None:
            continue
        by_loop.setdefault(s.loop, []).append(s._event)
    for loop, events in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_events, events)
        except RuntimeError:            # the reader's loop is closed: nobody will read
            for s in streams:
                if s.loop is loop and s._abort is not None and not s._done:
                    s._abort(s.request_id)


def _set_events(events: list[asyncio.Event]) -> None:
    for e in events:
        e.set()


class _DeltaTracker:
    """Turns a request's cumulative outputs into deltas: per completion, the text, token
    ids and logprobs not yet given out."""

    def __init__(self) -> None:
        self.sent: dict[int, tuple[int, int, bool]] = {}   # index -> (chars, tokens, finished)

    def delta(self, out: RequestOutput) -> RequestOutput | None:
        comps: list[CompletionOutput] = []
        for c in out.outputs:
            chars, toks, was_done = self.sent.get(c.index, (0, 0, False))
            if len(c.text) == chars and len(c.token_ids) == toks and c.finished == was_done:
                continue
            new_ids = list(c.token_ids[toks:])
            comps.append(dataclasses.replace(
                c, text=c.text[chars:], token_ids=new_ids, new_token_ids=new_ids,
                logprobs=None if c.logprobs is None else list(c.logprobs[toks:])))
            self.sent[c.index] = (len(c.text), len(c.token_ids), c.finished)
        if not comps and not out.finished:
            return None
        return dataclasses.replace(out, outputs=comps,
                                   new_token_ids=comps[0].token_ids if len(out.outputs) == 1 and comps else [])
