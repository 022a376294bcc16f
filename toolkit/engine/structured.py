"""StructuredOutputManager: every grammar-constrained request's grammar, in one place.

    sm.submit(req)                     # at add_request: compile off the step path (a thread)
    ready, failed = sm.take_compiled() # each step: requests whose grammar is ready join the scheduler
    ended = sm.advance(requests)       # after the forward is launched: grammars take last step's tokens
    sm.record(result)                  # the tokens this step emitted, taken next step
    sm.grammars                        # request id -> Grammar (the runner's mask rows)

A grammar takes its request's tokens one step late, while the GPU runs the next forward, so
that host work overlaps the GPU's; the masks never need them earlier. A grammar that ends
there (accepted EOS: "stop"; rejected token or dead end: "grammar") finishes its request
with that step's tokens dropped, so the output is what it would have been had the end been
found at once.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, Iterable, Sequence

from toolkit.types import Request, StepResult


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, *, vocab_size: int, eos_token_ids: Sequence[int],
                 max_rollback: int = 1, compile_timeout_s: float = 60.0, limits: Any = None) -> None:
        if not compile_timeout_s > 0:
            raise ValueError(f"compile_timeout_s must be > 0, got {compile_timeout_s!r}")
        # a request whose grammar has not compiled after this long is rejected (its compile,
        # which cannot be interrupted, is cancelled if it has not started)
        self.compile_timeout_s = float(compile_timeout_s)
        # what a request may ask to compile (GrammarLimits; None: its defaults), refused at
        # add_request: a started compile cannot be interrupted, so its input is bounded
        self.limits = limits
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.max_rollback = max_rollback
        self.grammars: dict[str, Any] = {}                  # request id -> its Grammar
        self._pending: dict[str, list[int]] = {}             # tokens a grammar has not taken yet
        self._compiling: list[tuple[Request, Future, float]] = []   # waiting: (request, compile, since)
        self._compiler = None

    def submit(self, request: Request) -> None:
        """Compile request's spec off the step path; it joins the scheduler once compiled.
        Cheap errors (syntax, unsupported features) raise ValueError here, nothing kept."""
        future = self.compiler().compile_async(request.sampling_params.structured)
        self._compiling.append((request, future, time.monotonic()))

    def compiler(self):
        if self.tokenizer is None:
            raise ValueError("structured output needs a tokenizer; this engine has none")
        if self._compiler is None:
            from toolkit.samplers.grammar import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer, vocab_size=self.vocab_size,
                                             eos_token_ids=self.eos_token_ids, limits=self.limits)
        return self._compiler

    @property
    def num_compiling(self) -> int:
        return len(self._compiling)

    def take_compiled(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """(requests whose grammar is ready, (request, error) for those that failed to compile)."""
        ready, failed, still, late = [], [], [], []
        now = time.monotonic()
        for req, fut, since in self._compiling:
            if not fut.done():
                if now - since <= self.compile_timeout_s:
                    still.append((req, fut, since))
                else:
                    failed.append((req, f"the grammar did not compile within {self.compile_timeout_s:g} s; "
                                        "simplify it (fewer optional properties, a smaller regex)"))
                    late.append(fut)
                continue
            try:
                self.grammars[req.request_id] = fut.result().new_grammar(max_rollback=self.max_rollback)
                ready.append(req)
            except Exception as e:      # noqa: BLE001 - any compile error rejects the request alone
                failed.append((req, str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"))
        self._compiling = still
        self._cancel_unwanted(late)
        return ready, failed

    def record(self, result: StepResult) -> None:
        """Keep the tokens each constrained request emitted; its grammar takes them next step."""
        for rid, toks in result.sampled_token_ids.items():
            if rid in self.grammars:
                self._pending.setdefault(rid, []).extend(toks)

    def advance(self, requests: Iterable[Request]) -> dict[str, str]:
        """Each sampling request's grammar takes the tokens its request emitted since it last
        sampled. Returns {request id: finish reason} for the grammars that ended."""
        ended: dict[str, str] = {}
        if not self._pending:                        # no grammar waits: no per-request work
            return ended
        for req in requests:
            toks = self._pending.pop(req.request_id, None)
            grammar = self.grammars.get(req.request_id)
            if not toks or grammar is None:
                continue
            if not grammar.accept(toks):
                ended[req.request_id] = "grammar"
            elif grammar.is_terminated():
                ended[req.request_id] = "stop"
            else:
                sp = req.sampling_params
                allow_eos = not (sp.ignore_eos or req.num_output_tokens < sp.min_tokens)
                if not grammar.can_continue(allow_eos=allow_eos):
                    ended[req.request_id] = "grammar"
        return ended

    def remove(self, request_ids: Iterable[str]) -> None:
        ids = set(request_ids)
        gone = [f for r, f, _ in self._compiling if r.request_id in ids]
        self._compiling = [c for c in self._compiling if c[0].request_id not in ids]
        self._cancel_unwanted(gone)
        for rid in ids:
            self.grammars.pop(rid, None)
            self._pending.pop(rid, None)

    def _cancel_unwanted(self, futures: list[Future]) -> None:
        """Compiles no waiting request needs any more: cancelled if not started (a started
        one runs to its end; its result stays cached)."""
        for f in futures:
            if not any(f is g for _, g, _ in self._compiling):
                f.cancel()

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
