"""Engine: the step loop. It is the only place where the parts meet.

    out = scheduler.schedule()                     # who runs how many tokens
    fwd = runner.execute_model(out, prev)          # prepare + launch the forward (executor)
    ended = structured.advance(...)                # grammars take last tokens while the GPU runs
    launched = runner.sample_tokens(fwd, grammars, ended)   # bitmasks + sampling; tokens on device
    -- land the step before (async) or this one (sync): --
    result = launched.result()                     # the one host wait -> StepResult
    finished = scheduler.update(out, result)       # (async: resolve_placeholders) stops, free blocks
    outputs, stopped = output_processor.process(out, finished, result)  # text, stop strings, n > 1
    proposer.propose(running)                      # drafts for the next step (speculative)

Per-request state lives in one place per concern: the scheduler's Request (tokens, blocks),
the output processor (text, logprobs, metrics, the n sequences of one user request), the
structured-output manager (grammars) and the sibling queue (samples 1.. of n waiting for
sample 0's prompt).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from toolkit.worker.inflight import Launched
from toolkit.engine.observe import StepObserver, step_record
from toolkit.engine.output import OUTPUT_KINDS, OutputProcessor, sequence_ids
from toolkit.worker.runner import Runner
from toolkit.engine.siblings import SiblingQueue
from toolkit.engine.sleep import SleepMode
from toolkit.engine.structured import StructuredOutputManager
from toolkit.engine.vllm_compat import BestOf, resolve_words
from toolkit.pooling.params import PoolingParams
from toolkit.samplers.base import check_token_ids
from toolkit.schedulers.policies import policy_of, warn_ignored_priority
from toolkit.types import (
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    SchedulerOutput,
    token_id_list,
)

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model, tokenizer, scheduler, runner: Runner, *, allocator, block_size: int,
                 num_blocks: int, max_model_len: int, eos_token_id: int | None,
                 proposer: Any = None, num_spec_tokens: int = 0, async_scheduling: bool = False) -> None:
        self.model, self.tokenizer, self.scheduler, self.runner = model, tokenizer, scheduler, runner
        self.allocator = allocator
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.output_processor = OutputProcessor(tokenizer)
        self.structured = StructuredOutputManager(
            tokenizer, vocab_size=model.spec.vocab_size, max_rollback=num_spec_tokens + 1,
            eos_token_ids=list(model.spec.eos_token_ids or [eos_token_id]))
        self.siblings = SiblingQueue(scheduler)
        self.proposer, self.num_spec_tokens = proposer, num_spec_tokens
        self.observers: list[StepObserver] = []
        self._gpu_timed: list[StepObserver] = []   # observers that asked for StepRecord.gpu_time
        # async scheduling: step N + 1 is scheduled and launched before step N's tokens reach
        # the host; off with a proposer (drafts need the tokens) or a scheduler that does not
        # declare supports_async. Sequences in _host_tokens (grammars, bad words, penalties
        # without the runner's device rows: their next step reads the last token's value on
        # the host) run synchronous steps.
        self.async_scheduling = (bool(async_scheduling) and proposer is None
                                 and bool(getattr(scheduler, "supports_async", False)))
        self._inflight: _InFlight | None = None
        self._host_tokens: set[str] = set()
        self._undelivered: list[RequestOutput] = []      # outputs the next step returns first
        # grammars that ended in a step whose sampling then failed (their advance() is done):
        # the next step reports them
        self._ended_unsampled: dict[str, str] = {}
        self._ids = itertools.count()
        self.best_of = BestOf()                      # best_of > n: only the n best are reported
        self._salts = itertools.count(1)             # a private prefix-cache key per prompt_logprobs request
        self.closed = False
        self.pooling = None                          # EnginePooling (build_engine): embed / classify / score
        # seconds (build_engine): load_s, kv_cache_s, warmup_s; on CUDA also the warm-up's
        # compile_s (kernels_compiled of them) and capture_s
        self.startup: dict[str, float] = {}
        self._lead: int | None = None          # the tokenizer's leading special ids (pooling truncation)
        self.num_steps = 0
        self._num_landed = 0             # steps reported to observers
        self.num_overlapped_steps = 0    # steps launched before the last one's tokens were taken
        self.num_preemptions = 0
        self.spec_drafted = 0            # draft tokens verified, over all requests
        self.spec_accepted = 0           # of which accepted
        self.spec_steps = 0              # verification rows (request-steps that had drafts)
        self.sleep_mode = SleepMode(self)    # sleep / wake_up / update_weights (engine/sleep.py)

    # -- requests --
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | PoolingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0,
                    arrival_time: float | None = None, client_id: str | None = None,
                    deadline: float | None = None, expected_output_len: int | None = None,
                    output_kind: str = "cumulative", lora_request: Any = None) -> str:
        """Validate and queue one request (n > 1: its n samples); returns its id. Bad input
        raises ValueError / TypeError naming what was wrong, and nothing is queued.

        output_kind "cumulative": `step()` returns a RequestOutput for this request (all its
        text and tokens so far) at every step that changed it; "final": only when it
        finishes (what LLM.generate uses: no per-step output objects).

        priority, client_id, deadline (seconds after arrival) and expected_output_len are
        stored on the Request for the scheduler's policy; a policy that needs one the request
        lacks refuses it, and a priority given to a policy that ignores it warns.

        lora_request: a LoRARequest (enable_lora=True): the adapter is read and checked here
        (ValueError for a missing folder, a rank above max_lora_rank, a module the model lacks).

        n (and best_of) are at most the scheduler's max_num_seqs (a request's samples fit in
        one batch); beyond, a ValueError before any per-sample work.

        With n > 1 the samples are sequences "<id>#0" ... "<id>#(n-1)" for the scheduler; the
        outputs merge them into one RequestOutput with n completions. Samples 1.. wait until
        sample 0 has computed the prompt, then start on its blocks (ref += 1; the partial last
        block is copied on write), or share its full blocks through the prefix cache."""
        self._check_open()
        self.sleep_mode.check_awake()
        params = SamplingParams() if params is None else params
        if isinstance(params, PoolingParams):         # prefill-only: embed / classify / score
            if lora_request is not None:
                raise ValueError("lora_request applies to generation; pooling requests (PoolingParams) "
                                 "run the base model: leave it out")
            return self._add_pooling(prompt, params, request_id, output_kind, arrival_time,
                                     dict(priority=priority, client_id=client_id, deadline=deadline,
                                          expected_output_len=expected_output_len))
        if not getattr(self.model.spec, "supports_generation", True):
            raise ValueError(f"{self.model.spec.architecture} has no LM head: it cannot generate; "
                             "use it for pooling (LLM.embed / classify / score, add_request with PoolingParams, "
                             "or the server's /v1/embeddings, /v1/score, /v1/rerank)")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}"
                            + (" (build one: SamplingParams(**d))" if isinstance(params, dict) else ""))
        rid = request_id if request_id is not None else self._new_id()
        if not isinstance(rid, str):
            raise TypeError(f"request_id must be a string, got {type(rid).__name__}")
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
        num_samples = self._check_num_samples(params)        # before any per-sample work
        self._check_ids_free(rid, num_samples)
        text, ids = self.tokenize(prompt)
        params = resolve_words(params, self.tokenizer)      # bad words as text -> token ids
        self._check_prompt(ids, params)
        self._check_lora(lora_request)
        fields = dict(priority=priority, client_id=client_id, deadline=deadline,
                      expected_output_len=expected_output_len, lora_request=lora_request)
        sids = sequence_ids(rid, num_samples)
        added = queued = False
        try:
            params = self.best_of.expand(rid, params)
            sequences = [self._sequence(sid, j, ids, params, fields, arrival_time) for j, sid in enumerate(sids)]
            warn_ignored_priority(policy_of(self.scheduler), priority)     # once the fields are valid
            if params.structured is not None:
                for seq in sequences:           # cheap grammar errors raise here: nothing kept
                    self.structured.submit(seq)
            self.output_processor.add(rid, text, sequences, output_kind)
            added = True
            if params.structured is None:
                queued = True
                self.scheduler.add_request(sequences[0])
                for seq in sequences[1:]:
                    self.siblings.hold(seq, sequences[0])
        except BaseException:
            # refused (a grammar error, a user's scheduler or policy): nothing is kept anywhere,
            # queued compiles included; the ids were free, so all that is under them is ours
            self.structured.remove(sids)
            self.siblings.remove(sids)
            if queued:                          # a policy that raised in on_add after queueing it
                self.scheduler.abort(sids[:1])
            self.best_of.forget([rid])
            if added:
                self.output_processor.forget(rid)
            raise
        if _needs_host_tokens(params, self.runner.penalty_history is not None):
            self._host_tokens.update(sids)
        return rid

    def _check_lora(self, lora_request: Any) -> None:
        """A request's adapter: read and checked by the runner's LoRA state (a no-op for None)."""
        if lora_request is None:
            return
        lora = getattr(self.runner, "lora", None)
        if lora is None:
            raise ValueError(f"lora_request={lora_request!r} needs an engine built with enable_lora=True "
                             "(LLM(..., enable_lora=True, max_loras=..., max_lora_rank=...))")
        lora.register(lora_request)
    def _add_pooling(self, prompt: Any, params: PoolingParams, rid: str | None, output_kind: str,
                     arrival_time: float | None, fields: dict) -> str:
        """add_request of a pooling request (toolkit/engine/pooling.py): one sequence, finished
        after its prompt's forward; its steps run synchronously (its result is host data)."""
        if self.pooling is None:
            raise ValueError("this engine has no pooler; it serves generation only")
        self.pooling.check(params)
        rid = rid if rid is not None else self._new_id()
        if not isinstance(rid, str):
            raise TypeError(f"request_id must be a string, got {type(rid).__name__}")
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
        self._check_ids_free(rid, 1)
        text, ids = self.tokenize(prompt)
        ids = self.pooling.truncate(ids, params, self.max_model_len,
                                    keep_first=self._leading_specials() if text is not None else 0)
        self._check_pooling_prompt(ids)
        req = self.pooling.request(rid, ids, params, next(self._salts), eos_token_id=self.eos_token_id,
                                   max_model_len=self.max_model_len, **fields,
                                   **({"arrival_time": arrival_time} if arrival_time is not None else {}))
        self.output_processor.add(rid, text, [req], output_kind)
        try:
            self.scheduler.add_request(req)
        except BaseException:
            self.output_processor.forget(rid)
            raise
        self.pooling.live[rid] = params.task or "embed"
        self._host_tokens.add(rid)
        return rid

    def _check_pooling_prompt(self, ids: list[int]) -> None:
        """A pooling prompt may fill max_model_len (no output token follows it)."""
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; max_model_len={self.max_model_len}")
        vocab = self.model.spec.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}) (the model's vocabulary)")
        if -(-len(ids) // self.block_size) > self.num_blocks:
            raise ValueError(f"the prompt needs {-(-len(ids) // self.block_size)} KV blocks; the cache "
                             f"has {self.num_blocks} of {self.block_size} tokens")
        budget = getattr(self.scheduler, "max_num_batched_tokens", None)
        if not self.pooling.causal and budget is not None and len(ids) > budget:
            raise ValueError(f"the prompt has {len(ids)} tokens; bidirectional attention runs a prompt in "
                             f"one step, so at most max_num_batched_tokens={budget}")

    def _check_num_samples(self, params: SamplingParams) -> int:
        """The sequences a request runs (n, or best_of when larger); at most max_num_seqs, the
        engine's limit: one request's samples must fit in one batch."""
        num = max(params.n, params.best_of or 0)
        limit = getattr(self.scheduler, "max_num_seqs", None)
        if limit is not None and num > limit:
            name = "n" if num == params.n else "best_of"
            raise ValueError(f"{name}={num} is more than this engine's max_num_seqs={limit}; n and "
                             f"best_of must be in [1, {limit}] (a request's samples fit in one batch)")
        return num

    def _check_ids_free(self, rid: str, num_samples: int) -> None:
        """No live request or sample uses rid, nor (n > 1) the sample ids "<rid>#j": a user's
        id never collides with another request's internal sample id."""
        op = self.output_processor
        if rid in op or op.group_of(rid) is not None:
            raise ValueError(f"request id {rid!r} is already in use")
        if num_samples > 1:
            taken = [s for s in sequence_ids(rid, num_samples) if s in op or op.group_of(s) is not None]
            if taken:
                raise ValueError(f"request id {rid!r} with {num_samples} samples needs the sample ids "
                                 f"{rid!r}#0..#{num_samples - 1}; {taken[:3]} are in use; choose another id")

    def _new_id(self) -> str:
        """The next free automatic id (one a caller chose itself is skipped)."""
        while True:
            rid = str(next(self._ids))
            if rid not in self.output_processor and self.output_processor.group_of(rid) is None:
                return rid

    def _sequence(self, sid: str, j: int, ids: list[int], params: SamplingParams, fields: dict,
                  arrival_time: float | None) -> Request:
        """Sample j (id sid) of a request: its own seed (derived from the request's), n = 1."""
        if params.n > 1:
            seed = None if params.seed is None else (params.seed * 1_000_003 + j) % 2**63
            params = dataclasses.replace(params, n=1, seed=seed)
        params = self._with_model_eos(params)
        # prompt logprobs need every prompt position computed: no prefix-cache hits (own salt)
        salt = next(self._salts) if params.prompt_logprobs is not None else 0
        if fields.get("lora_request") is not None:     # two adapters never share KV blocks
            from toolkit.lora.request import adapter_salt

            salt = adapter_salt(fields["lora_request"].lora_int_id, salt)
        return Request(sid, ids, params, eos_token_id=self.eos_token_id, **fields,
                       max_model_len=self.max_model_len, cache_salt=salt,
                       **({"arrival_time": arrival_time} if arrival_time is not None else {}))

    def _with_model_eos(self, params: SamplingParams) -> SamplingParams:
        """Models with several end tokens (Llama 3: <|end_of_text|>, <|eot_id|>, ...) stop on
        each: the request holds one eos id, the others stop it as stop token ids."""
        extra = [t for t in self.model.spec.eos_token_ids or () if t != self.eos_token_id]
        have = params.stop_token_ids or []
        if not extra or params.ignore_eos or all(t in have for t in extra):
            return params
        return dataclasses.replace(params, stop_token_ids=list(have) + [t for t in extra if t not in have])

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if len(ids) == 0:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; with max_model_len={self.max_model_len} "
                             f"at most {self.max_model_len - 1} leave room for one output token")
        vocab = self.model.spec.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            bad = [t for t in ids if not 0 <= t < vocab]
            raise ValueError(f"prompt token ids must be in [0, {vocab}) (the model's vocabulary); "
                             f"{len(bad)} are not, e.g. {bad[:3]}")
        check_token_ids(params, vocab)         # not later, where it would fail a whole step
        need = -(-(len(ids) + 1) // self.block_size)
        if need > self.num_blocks:
            raise ValueError(f"the prompt needs {need} KV blocks; the cache has {self.num_blocks} "
                             f"of {self.block_size} tokens")

    def abort(self, request_ids: str | Iterable[str]) -> None:
        """Finish these user requests now (all n samples) and free their blocks; unknown ids
        are skipped."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        # a sample's own id ("<id>#j") aborts its whole request: a request finishes as a whole
        ids = [self.output_processor.group_of(rid) or rid for rid in ids]
        seqs = [s for rid in ids for s in self.output_processor.sequence_ids(rid) or [rid]]
        self.siblings.remove(seqs)
        self.structured.remove(seqs)
        self.scheduler.abort(seqs)
        self._proposer_remove(seqs)
        self._host_tokens.difference_update(seqs)
        for rid in ids:
            self.output_processor.forget(rid)
        self.best_of.forget(ids)
        if self.pooling is not None:
            self.pooling.forget(ids)

    def request_ids(self) -> list[str]:
        """The user requests added and not yet finished (or aborted)."""
        return self.output_processor.request_ids()

    def has_unfinished(self) -> bool:
        return bool(self.structured.num_compiling or self._undelivered or len(self.siblings)
                    or self._inflight is not None or self.scheduler.has_unfinished())

    # -- the step --
    def step(self) -> list[RequestOutput]:
        """Run one step; returns the outputs of the step whose tokens reached the host: this
        one (synchronous), or the one before (async scheduling: this step was launched first,
        so the host's work on the last one overlaps the GPU's on this one)."""
        self._check_open()
        self.sleep_mode.check_awake()
        start = time.perf_counter()
        self._admit_waiting()                        # compiled grammars, siblings of a computed prompt
        out = self.scheduler.schedule()
        overlap = self._can_overlap(out)
        outputs = [] if overlap else self._land(start)   # this step needs the last one's tokens
        launched = self._launch(out, outputs)
        outputs += self._land(start)                 # the step before's, while the GPU runs this one
        provisional = self.scheduler.update(out, launched.placeholders()) if overlap else None
        self._inflight = _InFlight(out, launched, provisional)
        if not overlap:
            outputs += self._land(start)
        self._count(out, overlap)
        earlier, self._undelivered = self._undelivered, []
        return self.best_of.filter(earlier + outputs)

    def _can_overlap(self, out: SchedulerOutput) -> bool:
        """Async, and no sequence of this step reads its last token's value on the host."""
        return (self.async_scheduling and bool(out.scheduled)
                and not any(s.request_id in self._host_tokens for s in out.scheduled))

    def _launch(self, out: SchedulerOutput, landed: list[RequestOutput]):
        ended: dict[str, str] = {}
        try:
            fwd = self.runner.execute_model(out, self._inflight and self._inflight.launched)
            # the grammars take the last step's tokens while the GPU runs this step's forward;
            # the bitmasks they give are applied when it samples
            ended = self.structured.advance(fwd.batch.sampling) if fwd.batch is not None else {}
            if self._ended_unsampled and fwd.batch is not None:
                carried, self._ended_unsampled = self._ended_unsampled, {}
                ended.update({r.request_id: carried.pop(r.request_id)
                              for r in fwd.batch.sampling if r.request_id in carried})
                # the rest wait for their next sampling step, unless they are gone
                self._ended_unsampled = {r: e for r, e in carried.items() if r in self.structured.grammars}
            return self.runner.sample_tokens(fwd, self.structured.grammars, ended)
        except BaseException:
            self._undelivered += landed              # already landed: the next step returns them
            if ended:                                # a failed sampling: its requests run again
                self._ended_unsampled.update({r: e for r, e in ended.items() if r in self.structured.grammars})
            raise

    def _count(self, out: SchedulerOutput, overlap: bool) -> None:
        self.num_steps += 1
        self.num_overlapped_steps += overlap
        self.num_preemptions += len(out.preempted_ids)

    def _land(self, start: float) -> list[RequestOutput]:
        """Take the in-flight step's tokens: update the scheduler (or resolve its
        placeholders), the outputs, the grammars and drafts."""
        f, self._inflight = self._inflight, None
        if f is None:
            return []
        result = f.launched.result()
        if f.provisional is None:
            finished = self.scheduler.update(f.out, result)
        else:
            finished = self.scheduler.resolve_placeholders(f.provisional, result)
        outputs, stopped = self.output_processor.process(f.out, finished, result)
        self._retire(stopped, outputs, result)
        if self.pooling is not None:
            outputs = self.pooling.convert(outputs, result.pooled)
        if self.proposer is not None:
            self._propose(f.out, result)
        if self.observers:
            self._notify(start, f.out, result, outputs, f.launched.gpu_seconds(), f.launched.wait)
        return outputs

    def _admit_waiting(self) -> None:
        ready, failed = self.structured.take_compiled()
        for req in ready:
            self.scheduler.add_request(req)
        for req, err in failed:
            log.warning("request %s rejected: %s", req.request_id, err)
            self._reject_group(req.request_id, err)
        self.siblings.release()

    def _reject_group(self, seq_id: str, err: str) -> None:
        """A sequence whose grammar failed to compile: its whole user request is rejected."""
        rid = self.output_processor.group_of(seq_id)
        if rid is None:
            return                                   # a sibling already rejected it
        seqs = self.output_processor.sequence_ids(rid)
        self.structured.remove(seqs)
        self.siblings.remove(seqs)
        self.scheduler.abort(seqs)
        self._host_tokens.difference_update(seqs)
        self._undelivered.append(self.output_processor.reject(rid, err))

    def _retire(self, stopped: list[str], outputs: list[RequestOutput], result) -> None:
        """Sequences a stop string finished leave the scheduler; finished ones leave every table."""
        if stopped:
            self.scheduler.abort(stopped)
        self.structured.record(result)
        gone = stopped + [s for o in outputs if o.finished
                          for s in sequence_ids(o.request_id, len(o.outputs))]
        self._host_tokens.difference_update(gone)
        if gone:
            self.structured.remove(gone)
            self._proposer_remove(gone)
        for rid, n in result.num_draft_tokens.items():
            self.spec_drafted += n
            self.spec_accepted += result.num_accepted(rid)
            self.spec_steps += 1

    def _proposer_remove(self, ids: list[str]) -> None:
        if self.proposer is not None and ids:
            self.proposer.remove(ids)          # a draft model forgets their KV state

    def _propose(self, out, result) -> None:
        from toolkit.samplers.speculative.base import draft_budget

        live = [s.request for s in out.scheduled if s.request_id in result.sampled_token_ids
                and s.request.status is RequestStatus.RUNNING
                and s.request.num_computed_tokens == s.request.num_tokens - 1]
        if not live:
            return
        for r, d in zip(live, self.proposer.propose(live, self.num_spec_tokens)):
            n = draft_budget(r, self.num_spec_tokens)
            r.spec_token_ids = list(d.token_ids[:n])
            r.spec_token_probs = None if d.probs is None else d.probs[: len(r.spec_token_ids)]

    # -- observers --
    def add_observer(self, observer: StepObserver, *, gpu_time: bool = False) -> None:
        """Call observer(StepRecord) after every step (see toolkit.engine.observe).
        gpu_time=True: while it is attached, CUDA steps are timed on the stream (two events a
        step) and the records carry StepRecord.gpu_time."""
        if not callable(observer):
            raise TypeError(f"an observer must be callable with a StepRecord, got {type(observer).__name__}")
        self.observers.append(observer)
        if gpu_time:
            self._gpu_timed.append(observer)
        self.runner.time_gpu = bool(self._gpu_timed)

    def remove_observer(self, observer: StepObserver) -> None:
        self.observers.remove(observer)
        if observer in self._gpu_timed:
            self._gpu_timed.remove(observer)
        self.runner.time_gpu = bool(self._gpu_timed)

    def _notify(self, start: float, out, result, outputs: list[RequestOutput], gpu_time: float | None,
                wait_time: float | None) -> None:
        rec = step_record(self._num_landed, start, time.perf_counter(), out, result, self.scheduler,
                          self.allocator, sum(o.finished for o in outputs), gpu_time, wait_time)
        self._num_landed += 1
        for obs in list(self.observers):
            try:
                obs(rec)
            except Exception:                # an observer's bug must not lose the step's outputs
                log.exception("step observer %r raised; the engine goes on", obs)

    def __repr__(self) -> str:
        from toolkit.engine.describe import engine_repr

        return engine_repr(self)

    def _repr_html_(self) -> str:
        from toolkit.engine.describe import engine_html

        return engine_html(self)

    @property
    def spec_metrics(self) -> dict[str, float]:
        """Overall speculative-decoding figures: drafted, accepted, acceptance rate, and mean
        accepted length (tokens emitted per verification: 1 + accepted / verifications)."""
        return dict(drafted=self.spec_drafted, accepted=self.spec_accepted,
                    acceptance_rate=self.spec_accepted / max(self.spec_drafted, 1),
                    mean_accepted_length=1 + self.spec_accepted / max(self.spec_steps, 1))

    def _leading_specials(self) -> int:
        """How many ids the tokenizer puts before any text ([CLS], BOS): the ids `encode`
        gives an empty text and a word alike at the start."""
        if self._lead is None:
            empty, word = list(self.tokenizer.encode("")), list(self.tokenizer.encode("a"))
            n = 0
            while n < min(len(empty), len(word)) and empty[n] == word[n]:
                n += 1
            self._lead = n
        return self._lead

    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a prompt given as text or as token ids (a list, a
        tuple, or a one-dimensional integer numpy array / torch tensor)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass token ids instead of text")
            return prompt, list(self.tokenizer.encode(prompt))
        if prompt is None:
            raise TypeError("a prompt must be text or a list of token ids, got None")
        return None, token_id_list(prompt)

    # -- sleep mode and weight updates (engine/sleep.py) --
    def sleep(self, level: int = 1) -> None:
        """Free the device memory of the KV cache and the weights (level 1: weights kept in
        host memory; level 2: discarded). Needs an idle engine and enable_sleep_mode=True."""
        self._check_open()
        self.sleep_mode.sleep(level)

    def wake_up(self, tags: Iterable[str] | str | None = None) -> None:
        """Bring back "weights" and / or "kv_cache" (None: both)."""
        self._check_open()
        self.sleep_mode.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.sleep_mode.is_sleeping()

    def update_weights(self, weights: Any) -> int:
        """Load (checkpoint name, tensor) pairs in place, all or nothing; resets the prefix cache."""
        self._check_open()
        return self.sleep_mode.update_weights(weights)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing done) while requests are in flight."""
        self._check_open()
        return self.sleep_mode.reset_prefix_cache()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this engine is closed (close() freed its KV cache and weights); "
                               "build a new LLM to go on")

    def close(self) -> None:
        """Free the KV cache, the weights (and a draft model's) and the CUDA graphs: every
        reference the engine holds to them is dropped, then the cyclic garbage they sit in is
        collected (a model's parameters reference their module through weight_loader: only
        the collector frees them) and the CUDA allocator's cache is emptied, so the device
        memory is free for the next engine of the process when close() returns."""
        if self.closed:
            return
        self.closed = True
        self.runner.close()                  # the KV cache (and tensor-parallel workers)
        self.structured.close()
        self.runner = None  # type: ignore[assignment]
        self.model = None
        self.proposer = None                 # a draft model holds its weights and KV cache
        self.pooling = None
        self._inflight = None                # the last launched step's device tensors
        self._undelivered = []
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        log.info("engine closed after %d steps", self.num_steps)


@dataclass
class _InFlight:
    """A launched step whose tokens have not been taken yet."""

    out: SchedulerOutput
    launched: Launched
    provisional: list[RequestOutput] | None    # update()'s outputs with placeholders (async)


def _needs_host_tokens(sp: SamplingParams, device_penalties: bool) -> bool:
    """Whether a request's next step reads its last token's value on the host (a grammar's
    mask; bad words' token lists; the penalties' lists unless the runner keeps them on the
    device, worker/penalty_history.py): it then runs synchronous steps."""
    return sp.structured is not None or bool(sp.bad_words) or (sp.has_penalties and not device_penalties)
