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

from concurrent.futures import Future
from typing import Any, Iterable, Sequence

from toolkit.types import Request, StepResult


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, *, vocab_size: int, eos_token_ids: Sequence[int],
                 max_rollback: int = 1) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.max_rollback = max_rollback
        self.grammars: dict[str, Any] = {}                  # request id -> its Grammar
        self._pending: dict[str, list[int]] = {}             # tokens a grammar has not taken yet
        self._compiling: list[tuple[Request, Future]] = []   # waiting for a compile
        self._compiler = None

    def submit(self, request: Request) -> None:
        """Compile request's spec off the step path; it joins the scheduler once compiled.
        Cheap errors (syntax, unsupported features) raise ValueError here, nothing kept."""
        future = self.compiler().compile_async(request.sampling_params.structured)
        self._compiling.append((request, future))

    def compiler(self):
        if self.tokenizer is None:
            raise ValueError("structured output needs a tokenizer; this engine has none")
        if self._compiler is None:
            from toolkit.samplers.grammar import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer, vocab_size=self.vocab_size,
                                             eos_token_ids=self.eos_token_ids)
        return self._compiler

    @property
    def num_compiling(self) -> int:
        return len(self._compiling)

    def take_compiled(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """(requests whose grammar is ready, (request, error) for those that failed to compile)."""
        ready, failed, still = [], [], []
        for req, fut in self._compiling:
            if not fut.done():
                still.append((req, fut))
                continue
            try:
                self.grammars[req.request_id] = fut.result().new_grammar(max_rollback=self.max_rollback)
                ready.append(req)
            except Exception as e:      # noqa: BLE001 - any compile error rejects the request alone
                failed.append((req, str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"))
        self._compiling = still
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
        self._compiling = [(r, f) for r, f in self._compiling if r.request_id not in ids]
        for rid in ids:
            self.grammars.pop(rid, None)
            self._pending.pop(rid, None)

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
