"""Engine: the step loop. It is the only place where the parts meet.

    out = scheduler.schedule()                     # who runs how many tokens
    logits = runner.forward(runner.prepare(out))   # one ragged forward over the paged cache
    tokens = runner.sample(batch, logits, masks)   # grammar masks -> sampler (or draft verifier)
    outputs = scheduler.update(out, tokens)        # append, token-level stops, free blocks
    outputs = output_processor.process(outputs)    # text, stop strings, metrics
    proposer.propose(running)                      # drafts for the next step (speculative)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from concurrent.futures import Future
from typing import Any, Iterable, Sequence

import torch

from toolkit.engine.output import OutputProcessor
from toolkit.engine.runner import Runner
from toolkit.samplers.base import check_token_ids
from toolkit.types import CompletionOutput, Request, RequestOutput, RequestStatus, SamplingParams

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model, tokenizer, scheduler, runner: Runner, *, block_size: int,
                 num_blocks: int, max_model_len: int, eos_token_id: int | None,
                 proposer: Any = None, num_spec_tokens: int = 0) -> None:
        self.model, self.tokenizer, self.scheduler, self.runner = model, tokenizer, scheduler, runner
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.output_processor = OutputProcessor(tokenizer)
        self.proposer, self.num_spec_tokens = proposer, num_spec_tokens
        self.grammars: dict[str, Any] = {}               # request id -> its Grammar
        self._pending: dict[str, list[int]] = {}           # tokens a grammar has not taken yet
        self._compiling: list[tuple[Request, Future]] = []  # waiting for a grammar compile
        self._compiler = None
        self._rejected: list[RequestOutput] = []
        self._held: list[tuple[Request, Request]] = []    # (sibling, leader whose prompt it waits for)
        self._live: dict[str, Request] = {}                # request id -> request, until finished
        self._ids = itertools.count()
        self.num_steps = 0
        self.num_preemptions = 0
        self.spec_drafted = 0            # draft tokens verified, over all requests
        self.spec_accepted = 0           # of which accepted
        self.spec_steps = 0              # verification rows (request-steps that had drafts)

    # -- requests --
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0,
                    arrival_time: float | None = None, after: str | None = None) -> str:
        """Validate and queue one request; raises ValueError (nothing queued) on bad input.

        after: the id of a live request with the same prompt (a sibling sample of n > 1); this
        one joins the scheduler only once that one has computed its prompt, and is forked onto
        its blocks (ref += 1; the partial last block is copied on write), or, where the
        scheduler cannot fork, shares the full blocks through the prefix cache."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        extra_eos = [t for t in getattr(self.model, "eos_token_ids", None) or () if t != self.eos_token_id]
        if extra_eos and not params.ignore_eos:
            # models with several end tokens (Llama 3: <|end_of_text|>, <|eot_id|>, ...) stop on
            # each; the request holds one eos id, the others stop it as stop token ids
            params = dataclasses.replace(params, stop_token_ids=list(params.stop_token_ids or []) + [
                t for t in extra_eos if t not in (params.stop_token_ids or [])])
        text, ids = self.tokenize(prompt)
        if len(ids) == 0:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; with max_model_len={self.max_model_len} "
                             f"at most {self.max_model_len - 1} leave room for one output token")
        vocab = self.model.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got [{min(ids)}, {max(ids)}]")
        check_token_ids(params, vocab)         # not later, where it would fail a whole step
        if -(-(len(ids) + 1) // self.block_size) > self.num_blocks:
            raise ValueError(f"the prompt needs {-(-(len(ids) + 1) // self.block_size)} KV blocks; the cache "
                             f"has {self.num_blocks} of {self.block_size} tokens")
        future = self._compile(params.structured) if params.structured is not None else None
        rid = request_id if request_id is not None else str(next(self._ids))
        if rid in self._live:
            raise ValueError(f"request id {rid!r} is already in use")
        # prompt logprobs need every prompt position computed: no prefix-cache hits (own salt)
        salt = hash(("prompt_logprobs", rid)) if params.prompt_logprobs is not None else 0
        req = Request(rid, ids, params, eos_token_id=self.eos_token_id, priority=priority,
                      max_model_len=self.max_model_len, cache_salt=salt,
                      **({"arrival_time": arrival_time} if arrival_time is not None else {}))
        self._live[rid] = req
        self.output_processor.add(req, text)
        leader = self._live.get(after) if after is not None else None
        if leader is not None and future is None:
            self._held.append((req, leader))
        elif future is None:
            self.scheduler.add_request(req)
        else:
            self._compiling.append((req, future))   # joins the scheduler once compiled
        return rid

    def abort(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._compiling = [(r, f) for r, f in self._compiling if r.request_id not in ids]
        self._held = [(r, lead) for r, lead in self._held if r.request_id not in ids]
        self.scheduler.abort(ids)
        for rid in ids:
            self.output_processor.forget(rid)
            self.grammars.pop(rid, None)
            self._pending.pop(rid, None)
            self._live.pop(rid, None)
        if hasattr(self.proposer, "remove"):
            self.proposer.remove(ids)

    def has_unfinished(self) -> bool:
        return (bool(self._compiling) or bool(self._rejected) or bool(self._held)
                or self.scheduler.has_unfinished())

    # -- the step --
    def step(self) -> list[RequestOutput]:
        self._admit_compiled()
        self._release_held()
        out = self.scheduler.schedule()
        sampled: dict[str, list[int]] = {}
        forced: dict[str, str] = {}
        if out.scheduled:
            batch = self.runner.prepare(out)
            logits = self.runner.forward(batch)
            # the grammars take last step's tokens now, while the GPU runs the forward
            ended = self._advance_grammars(batch.sampling)
            for rid, start, _, _ in batch.prompt_owner or ():
                self.output_processor.add_prompt_logprobs(rid, start, batch.prompt_logprobs[rid])
            emitted, logprobs = self.runner.sample(batch, logits, self.grammars)
            for req, d, toks, lp in zip(batch.sampling, batch.drafts, emitted, logprobs):
                if req.request_id in ended:
                    continue             # its grammar ended before this step: its tokens are void
                sampled[req.request_id] = toks
                if lp is not None:
                    self.output_processor.add_logprobs(req.request_id, lp)
                if d:
                    self.spec_drafted += len(d)
                    self.spec_accepted += len(toks) - 1
                    self.spec_steps += 1
                    self.output_processor.add_spec(req.request_id, len(d), len(toks) - 1)
                if req.request_id in self.grammars:
                    self._pending.setdefault(req.request_id, []).extend(toks)
            if ended:                    # finished here, with no new tokens
                self.scheduler.abort(list(ended))
                forced.update(ended)
        self.num_steps += 1
        self.num_preemptions += len(out.preempted_ids)
        results = self.scheduler.update(out, sampled)
        results += [RequestOutput(rid, [], False, None, None) for rid in forced]
        outputs, stopped = self.output_processor.process(results, forced)
        if stopped:
            self.scheduler.abort(stopped)   # a stop string or the grammar finished these
        done = [o.request_id for o in outputs if o.finished]
        for rid in done:
            self.grammars.pop(rid, None)
            self._pending.pop(rid, None)
            self._live.pop(rid, None)
        if done and hasattr(self.proposer, "remove"):
            self.proposer.remove(done)           # a draft model forgets their KV state
        if self.proposer is not None and out.scheduled:
            self._propose(batch.sampling)
        rejected, self._rejected = self._rejected, []
        return rejected + outputs

    @property
    def spec_metrics(self) -> dict[str, float]:
        """Overall speculative-decoding figures: drafted, accepted, acceptance rate, and mean
        accepted length (tokens emitted per verification: 1 + accepted / verifications)."""
        return dict(drafted=self.spec_drafted, accepted=self.spec_accepted,
                    acceptance_rate=self.spec_accepted / max(self.spec_drafted, 1),
                    mean_accepted_length=1 + self.spec_accepted / max(self.spec_steps, 1))

    def _release_held(self) -> None:
        """Siblings join once their leader's prompt is computed: forked onto its prompt blocks
        (copy-on-write of the last one) when the scheduler can, else through the prefix cache."""
        still = []
        for req, lead in self._held:
            if lead.is_finished or lead.num_computed_tokens >= lead.num_prompt_tokens - 1:
                fork = getattr(self.scheduler, "fork", None)
                if lead.is_finished or fork is None or not fork(req, lead):
                    self.scheduler.add_request(req)
            else:
                still.append((req, lead))
        self._held = still

    def _propose(self, requests: list[Request]) -> None:
        from toolkit.samplers.speculative.base import draft_budget

        live = [r for r in requests if not r.is_finished and r.status is RequestStatus.RUNNING
                and r.num_computed_tokens == r.num_tokens - 1]
        if not live:
            return
        for r, d in zip(live, self.proposer.propose(live, self.num_spec_tokens)):
            n = draft_budget(r, self.num_spec_tokens)
            r.spec_token_ids = list(d.token_ids[:n])
            r.spec_token_probs = None if d.probs is None else d.probs[: len(r.spec_token_ids)]

    # -- structured output --
    def _compile(self, spec: Any) -> Future:
        if self.tokenizer is None:
            raise ValueError("structured output needs a tokenizer; this engine has none")
        if self._compiler is None:
            from toolkit.samplers.grammar import GrammarCompiler

            eos = list(getattr(self.model, "eos_token_ids", None) or [self.eos_token_id])
            self._compiler = GrammarCompiler(self.tokenizer, vocab_size=self.model.vocab_size,
                                             eos_token_ids=eos)
        return self._compiler.compile_async(spec)     # cheap checks raise ValueError here

    def _admit_compiled(self) -> None:
        still = []
        for req, fut in self._compiling:
            if not fut.done():
                still.append((req, fut))
                continue
            try:
                self.grammars[req.request_id] = fut.result().new_grammar(
                    max_rollback=self.num_spec_tokens + 1)
                self.scheduler.add_request(req)
            except ValueError as e:
                log.warning("request %s rejected: %s", req.request_id, e)
                self.output_processor.forget(req.request_id)
                self._live.pop(req.request_id, None)
                self._rejected.append(RequestOutput(
                    req.request_id, finished=True, finish_reason="rejected", stop_reason=str(e),
                    prompt_token_ids=req.prompt_token_ids,
                    outputs=[CompletionOutput(0, "", [], "rejected", str(e))]))
        self._compiling = still

    def _advance_grammars(self, requests: list[Request]) -> dict[str, str]:
        """Each sampling request's grammar takes the tokens the request emitted since it last
        sampled. Deferred from the step that sampled them to here, after the next forward is
        launched, so this host work overlaps the GPU; the masks never need them earlier.
        Returns {request id: finish reason} for the grammars that ended: "stop" after an
        accepted EOS, "grammar" after a rejected token or at a dead end (no token allowed;
        EOS counts only where the request may stop). Those requests end one step after their
        last token, with that step's tokens dropped: their outputs are what they were."""
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

    def tokenize(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a prompt given as text or as token ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass token ids instead of text")
            return prompt, list(self.tokenizer.encode(prompt))
        return None, [int(t) for t in prompt]

    def close(self) -> None:
        cache = getattr(self.runner, "kv_cache", None)
        if cache is not None:
            cache.close()
        if self._compiler is not None:
            self._compiler.close()
        self.runner = None  # type: ignore[assignment]
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        log.info("engine closed after %d steps", self.num_steps)
