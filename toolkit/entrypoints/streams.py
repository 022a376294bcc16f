"""Per-request streams between an engine loop (a thread, or a reader of the engine process)
and the readers (asyncio tasks or threads).

A stream keeps only the request's latest cumulative output: a slow reader misses nothing
(the outputs it skipped are contained in the latest) and never makes a queue grow; the
reader turns it into deltas (`DeltaTracker`). `Accumulator` is the inverse, for outputs that
crossed a process boundary as deltas.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import AsyncIterator, Callable, Literal

from toolkit.types import CompletionOutput, RequestOutput

OutputKind = Literal["delta", "cumulative", "final"]


class Stream:
    """The outputs of one request, as the loop thread produces them: it keeps only the
    latest cumulative output (a slow reader misses nothing: outputs are cumulative) and
    wakes the reader's event loop."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None,
                 abort: Callable[[str], None] | None = None, n: int = 1) -> None:
        self.request_id = request_id
        self.n = n                      # completions (an abort before any output still shows n)
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
        (`signal_all`: one wake-up per event loop for a whole step's outputs)."""
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
            have = {c.index: c for c in (last.outputs if last else [])}
            comps = [dataclasses.replace(have[i], finish_reason=have[i].finish_reason or "abort",
                                         new_token_ids=[])
                     if i in have else CompletionOutput(i, "", [], "abort")
                     for i in range(max(self.n, len(have)))]
            self._latest = RequestOutput(
                self.request_id, finished=True, finish_reason="abort",
                prompt=last.prompt if last else None,
                prompt_token_ids=last.prompt_token_ids if last else [],
                outputs=comps, metrics=last.metrics if last else None,
                lora_request=last.lora_request if last else None)
            self._done = True
            self._last_seen = self._latest
            self._cond.notify_all()
            out = self._latest
        self._signal()
        return out

    def _signal(self) -> None:
        signal_all([self])

    # reader side
    async def iterate(self, kind: OutputKind = "delta") -> AsyncIterator[RequestOutput]:
        self._event = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        delta = DeltaTracker()
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
            return self._last_seen


def signal_all(streams: list[Stream]) -> None:
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


class DeltaTracker:
    """Turns a request's cumulative outputs into deltas: per completion, the text, token
    ids and logprobs not yet given out (completions that did not change are left out)."""

    def __init__(self) -> None:
        self.sent: dict[int, tuple[int, int, bool]] = {}   # index -> (chars, tokens, finished)

    def delta(self, out: RequestOutput) -> RequestOutput | None:
        if not isinstance(out, RequestOutput):   # a pooling output: one final, whole object
            return out
        comps: list[CompletionOutput] = []
        for c in out.outputs:
            chars, toks, was_done = self.sent.get(c.index, (0, 0, False))
            n_chars, n_toks, done = len(c.text), len(c.token_ids), c.finish_reason is not None
            if n_chars == chars and n_toks == toks and done == was_done:
                continue
            new_ids = c.token_ids[toks:]
            comps.append(CompletionOutput(
                c.index, c.text[chars:], new_ids, c.finish_reason, c.stop_reason,
                logprobs=None if c.logprobs is None else c.logprobs[toks:],
                cumulative_logprob=c.cumulative_logprob, new_token_ids=new_ids))
            self.sent[c.index] = (n_chars, n_toks, done)
        if not comps and not out.finished:
            return None
        return RequestOutput(out.request_id, new_token_ids=comps[0].token_ids if len(out.outputs) == 1 and comps else [],
                             finished=out.finished, finish_reason=out.finish_reason,
                             stop_reason=out.stop_reason, prompt=out.prompt,
                             prompt_token_ids=out.prompt_token_ids, outputs=comps, metrics=out.metrics,
                             prompt_logprobs=out.prompt_logprobs, lora_request=out.lora_request)


class Accumulator:
    """Deltas of one request (as DeltaTracker makes them) back into cumulative outputs.
    Each call returns new objects: a reader may still hold the previous one."""

    def __init__(self) -> None:
        self.prompt: str | None = None
        self.prompt_token_ids: list[int] = []
        self.comps: dict[int, CompletionOutput] = {}

    def update(self, d: RequestOutput) -> RequestOutput:
        if not isinstance(d, RequestOutput):     # a pooling output crosses whole
            return d
        if d.prompt_token_ids:
            self.prompt_token_ids = d.prompt_token_ids
        if d.prompt is not None:
            self.prompt = d.prompt
        for c in d.outputs:
            cur = self.comps.get(c.index)
            if cur is None:
                self.comps[c.index] = dataclasses.replace(c, token_ids=list(c.token_ids))
                continue
            self.comps[c.index] = CompletionOutput(
                c.index, cur.text + c.text, cur.token_ids + c.token_ids, c.finish_reason, c.stop_reason,
                logprobs=None if cur.logprobs is None else cur.logprobs + (c.logprobs or []),
                cumulative_logprob=c.cumulative_logprob, new_token_ids=c.token_ids)
        comps = [self.comps[i] for i in sorted(self.comps)]
        return RequestOutput(d.request_id, new_token_ids=d.new_token_ids, finished=d.finished,
                             finish_reason=d.finish_reason, stop_reason=d.stop_reason, prompt=self.prompt,
                             prompt_token_ids=self.prompt_token_ids, outputs=comps, metrics=d.metrics,
                             prompt_logprobs=d.prompt_logprobs, lora_request=d.lora_request)
