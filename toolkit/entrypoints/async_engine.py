"""AsyncEngine: an engine loop in the background, for servers.

    engine = AsyncEngine(LLM(...))                       # the loop on a thread of this process
    engine = AsyncEngine.build(model, process=True, **llm_options)   # the loop in its own process
    async for out in engine.generate("Hello", SamplingParams(max_tokens=32)):
        print(out.outputs[0].text, end="")               # deltas: only what is new
    await engine.shutdown()

Any thread or asyncio task may add, stream and abort requests. `add` waits for the
engine's verdict, so bad input raises at the caller. Each request has a `Stream` holding
its latest cumulative output; the reader turns it into deltas when it reads, so a slow
reader never makes a queue grow (the steps it missed merge into one delta). Text in a
delta never has to be taken back (the output processor holds back a tail that could
still become a stop string). Cancelling or leaving the reader (a client that went away)
aborts the request and frees its KV blocks.

Where the loop runs is a `core`: `ThreadCore` (core_thread.py) shares this process's GIL
with its callers; `ProcessCore` (core_process.py) does not, which is what a server under
load needs (benchmarks/serving.py measures both).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import threading
import time
from typing import Any, AsyncIterator, Callable, Sequence

from toolkit.entrypoints import engine_calls
from toolkit.entrypoints.core_thread import EngineDeadError, ThreadCore
from toolkit.entrypoints.streams import OutputKind, Stream, signal_all
from toolkit.types import RequestOutput, SamplingParams

log = logging.getLogger(__name__)

__all__ = ["AsyncEngine", "EngineDeadError", "Overloaded", "Stream"]


class Overloaded(RuntimeError):
    """More requests are pending than the engine was told to accept (max_pending)."""


class AsyncEngine:
    """`engine` is an `Engine` or an `LLM`, run on a thread of this process; `build(...,
    process=True)` runs one in its own process instead."""

    def __init__(self, engine: Any, *, max_pending: int | None = None) -> None:
        self._front(max_pending)
        self.core = ThreadCore(engine, self._on_outputs, self._on_error)
        self.engine = self.core.engine        # the Engine (thread mode only: use call() to touch it)

    @classmethod
    def build(cls, model: Any = None, *, process: bool = False, max_pending: int | None = None,
              **llm_options: Any) -> "AsyncEngine":
        """An LLM built from the same arguments as `LLM(...)`; with process=True it is
        built and run in a child process (spawned: the model and options must pickle)."""
        if not process:
            from toolkit.entrypoints.llm import LLM

            return cls(LLM(model, **llm_options), max_pending=max_pending)
        from toolkit.entrypoints.core_process import ProcessCore

        self = cls.__new__(cls)
        self._front(max_pending)
        self.core = ProcessCore((model,), llm_options, self._on_outputs, self._on_error)
        self.engine = None
        return self

    def _front(self, max_pending: int | None) -> None:
        if max_pending is not None and (not isinstance(max_pending, int) or max_pending < 1):
            raise ValueError(f"max_pending must be a positive integer or None, got {max_pending!r}")
        self.max_pending = max_pending          # refuse new requests past this many unfinished
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()           # guards _streams (callers vs the core's thread)
        self._ids = itertools.count()
        self._accepting = True
        # called on the core's thread: with each request's final cumulative output (aborts
        # included), and with each step's StepRecord (see add_step_observer)
        self.finished_listeners: list[Callable[[RequestOutput], None]] = []
        self._step_observers: list[Callable[[Any], None]] = []

    # -- what a server reads --
    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.vocab_size

    @property
    def num_unfinished(self) -> int:
        """User requests added and not yet finished (what backpressure counts)."""
        return len(self._streams)

    @property
    def is_running(self) -> bool:
        return self.core.alive

    @property
    def accepting(self) -> bool:
        return self._accepting and self.core.alive

    @property
    def error(self) -> BaseException | None:
        return self.core.error

    # -- requests --
    def add(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
            request_id: str | None = None, **fields: Any) -> Stream:
        """Queue a request from any thread and wait for the engine to take it; returns its
        stream. `fields` are what `Engine.add_request` stores for the scheduling policy
        (priority, client_id, deadline, expected_output_len, arrival_time). Raises what
        `add_request` raises for bad input (nothing is queued then), `Overloaded` past
        `max_pending`, EngineDeadError after shutdown."""
        stream, taken = self._submit(prompt, params, request_id, fields, _running_loop())
        taken.result()
        return stream

    async def add_async(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                        request_id: str | None = None, **fields: Any) -> Stream:
        """`add` without blocking the event loop while the engine takes it."""
        stream, taken = self._submit(prompt, params, request_id, fields, asyncio.get_running_loop())
        try:
            await asyncio.wrap_future(taken)
        except asyncio.CancelledError:
            self.abort(stream.request_id)        # the add may have run: nobody will read it
            raise
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

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread (no wait); its stream ends with finish reason
        "abort". Unknown or finished ids are ignored."""
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        if self.core.alive:
            self.core.abort([request_id])
        self._finished(stream.finish_aborted())

    def _submit(self, prompt: Any, params: SamplingParams | None, request_id: str | None,
                fields: dict[str, Any], loop: asyncio.AbstractEventLoop | None,
                ) -> tuple[Stream, concurrent.futures.Future]:
        if not self.accepting:
            raise EngineDeadError("the engine is shutting down or stopped; it takes no new requests"
                                  + (f" (it stopped on: {self.error!r})" if self.error else ""))
        if self.max_pending is not None and self.num_unfinished >= self.max_pending:
            raise Overloaded(f"{self.num_unfinished} requests are pending (max_pending="
                             f"{self.max_pending}); retry later")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        stream = Stream(rid, loop, abort=self.abort, n=getattr(params, "n", 1))
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self._streams[rid] = stream          # before the add: its first output may be quick
        taken = self.core.add(rid, prompt, params, fields)
        taken.add_done_callback(lambda f: self._taken(f, rid, stream))
        return stream, taken

    def _taken(self, f: concurrent.futures.Future, rid: str, stream: Stream) -> None:
        """The engine's verdict on an add: refused (or the caller gave up waiting) -> the
        stream was never live; a cancelled add may still have reached the engine: abort."""
        if not f.cancelled() and f.exception() is None:
            return
        with self._lock:
            if self._streams.get(rid) is stream:
                del self._streams[rid]
        if f.cancelled() and self.core.alive:
            self.core.abort([rid])

    # -- observing --
    def add_step_observer(self, observer: Callable[[Any], None]) -> None:
        """Call observer(StepRecord) after every step, on the core's thread (in process
        mode the records cross the pipe, without their SchedulerOutput)."""
        if not callable(observer):
            raise TypeError(f"an observer must be callable with a StepRecord, got {type(observer).__name__}")
        self._step_observers.append(observer)
        if len(self._step_observers) == 1:
            self.core.observe(True)

    def remove_step_observer(self, observer: Callable[[Any], None]) -> None:
        self._step_observers.remove(observer)
        if not self._step_observers:
            self.core.observe(False)

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Run fn(engine) where the engine lives, between two steps (a consistent
        snapshot, a setting); a Future of its result. Process mode: fn must pickle."""
        return self.core.call(fn)

    def call_one(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """fn(engine) on one engine, a Future of its result: what every engine answers alike
        (its tasks, its tokenizer's ids). One engine here; one live replica of a set."""
        return self.core.call(fn)

    # -- sleep mode and weight updates (vLLM's AsyncLLM names), run between two steps --
    async def sleep(self, level: int = 1) -> None:
        """Free the device memory of the weights and the KV cache (LLM.sleep); the engine must
        be idle (RuntimeError otherwise) and built with enable_sleep_mode=True."""
        await self._engine_call(engine_calls.sleep, level=level)

    async def wake_up(self, tags: Sequence[str] | str | None = None) -> None:
        await self._engine_call(engine_calls.wake_up,
                                tags=list(tags) if isinstance(tags, (list, tuple)) else tags)

    async def is_sleeping(self) -> bool:
        return await self._engine_call(engine_calls.is_sleeping)

    async def update_weights(self, weights: Any) -> int:
        """LLM.update_weights where the engine lives (process mode: the tensors travel over
        the pipe, through shared memory)."""
        if not isinstance(weights, (dict, list, tuple)):
            weights = list(weights)               # a generator cannot travel to the engine's process
        return await self._engine_call(engine_calls.update_weights, weights=weights)

    async def reset_prefix_cache(self) -> bool:
        return await self._engine_call(engine_calls.reset_prefix_cache)

    async def _engine_call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """fn(engine, **kwargs) between two steps (a partial of a module-level function: it pickles)."""
        return await asyncio.wrap_future(self.core.call(functools.partial(fn, **kwargs) if kwargs else fn))

    # -- the core's side --
    def _on_outputs(self, outputs: list[RequestOutput], records: list[Any]) -> None:
        woken: list[Stream] = []
        finished: list[RequestOutput] = []
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                stream.put(out, signal=False)
                woken.append(stream)
                if out.finished:
                    del self._streams[out.request_id]
                    finished.append(out)
        signal_all(woken)
        for out in finished:
            self._finished(out)
        for rec in records:
            for obs in list(self._step_observers):
                try:
                    obs(rec)
                except Exception:                  # an observer's bug must not stop serving
                    log.exception("step observer %r raised", obs)

    def _on_error(self, error: BaseException, request_ids: list[str] | None = None) -> None:
        """A step failed (its requests were aborted) or the core died: end every stream, or
        only those of `request_ids` (a fault attributed to them)."""
        with self._lock:
            if request_ids is None:
                streams, self._streams = self._streams, {}
            else:
                streams = {r: s for r in request_ids if (s := self._streams.pop(r, None)) is not None}
        for s in streams.values():
            s.fail(error)

    def _finished(self, out: RequestOutput | None) -> None:
        for listener in list(self.finished_listeners) if out is not None else ():
            try:
                listener(out)
            except Exception:                      # a listener's bug must not stop serving
                log.exception("finished listener %r raised", listener)

    # -- lifecycle --
    async def shutdown(self, timeout: float = 0.0) -> None:
        """Stop taking requests; let running ones finish for up to `timeout` seconds, abort
        the rest, end the loop and free the engine (KV cache, weights)."""
        self._accepting = False
        deadline = time.monotonic() + max(timeout, 0.0)
        while self._streams and time.monotonic() < deadline and self.core.alive:
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Abort what is unfinished, stop the loop and close the engine (blocking)."""
        self._accepting = False
        for rid in list(self._streams):
            self.abort(rid)
        self.core.close()

    def __enter__(self) -> "AsyncEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def num_steps(self) -> int:
        return getattr(self.core, "num_steps", 0)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
