"""What every scheduler here shares: request bookkeeping, abort, and `update` (append the
sampled tokens, token-level stops, free finished requests' blocks, publish full blocks).

Blocks go through a `KVCacheManager` (`self.kv`): allocation, prefix-cache hits, publishing,
freeing and sharing. A subclass writes `schedule()` only: its policy and its token budget.
Conventions it relies on:
- `num_computed_tokens` changes in `update` (and at admission, by a prefix-cache hit),
  never in `schedule`; so `schedule` and `update` strictly alternate.
- `request.block_ids` is the request's block table; a finished request holds none.
- Requests that finish are reported once in the next `SchedulerOutput.finished_ids`.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Sequence

from toolkit.schedulers.kv_cache_manager import KVCacheManager
from toolkit.types import (
    PLACEHOLDER,
    Request,
    RequestOutput,
    RequestStatus,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
)


# preemption: "swap" copies a victim's KV to the host pool and back, "recompute" recomputes
# it, "auto" swaps a victim with at least SWAP_MIN_TOKENS computed tokens (below that the
# re-prefill rides in a batch for less than the copies' fixed cost; benchmarks/
# swap_vs_recompute.py measures the crossover). Swap needs a host pool; without one, or
# when it is full, every preemption recomputes.
PREEMPTION = ("auto", "swap", "recompute")
SWAP_MIN_TOKENS = 256


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_stop(request: Request, max_len: int) -> RequestStatus | None:
    """Token-level stop after the last appended token (stop ids beat length on the same token).

    EOS (unless ignore_eos) and stop_token_ids count only once min_tokens are out;
    FINISHED_LENGTH at max_tokens outputs or once the sequence holds max_len tokens.
    """
    sp = request.sampling_params
    outs = request.output_token_ids
    n = len(outs)                              # (hot path: once per request per step)
    if n >= sp.min_tokens:
        last = outs[-1]
        if last == request.eos_token_id and not sp.ignore_eos and last is not None:
            request.stop_reason = None
            return RequestStatus.FINISHED_STOPPED
        if sp.stop_token_ids and last in sp.stop_token_ids:
            request.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
    if n >= sp.max_tokens or len(request.prompt_token_ids) + n >= max_len:
        return RequestStatus.FINISHED_LENGTH
    return None


class SchedulerCore:
    """Bookkeeping shared by the schedulers; see the module docstring for the contract."""

    # declared capabilities (see schedulers/base.py); a subclass that can, says so
    supports_fork = False
    supports_async = False      # True: update() may take PLACEHOLDER tokens, resolved one step later
    supports_lora = False       # True: admission respects lora_pool (at most its slots' adapters run)

    def __init__(self, allocator, *, block_size: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                 enable_prefix_caching: bool = False, num_lookahead_tokens: int = 0,
                 clock: Callable[[], float] | None = None, host_tier=None,
                 preemption: str = "auto") -> None:
        # the time policies read (Request.arrival_time's clock); the simulator sets a virtual one
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self.now = self.clock()                   # read at the start of each schedule()
        self.block_size = _positive("block_size", block_size)
        self.kv = KVCacheManager(allocator, block_size=block_size,
                                 enable_prefix_caching=enable_prefix_caching,
                                 num_lookahead_tokens=num_lookahead_tokens, host_tier=host_tier)
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}, got {preemption!r}")
        self.preemption = preemption
        self.allocator = allocator
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive("max_num_batched_tokens", max_num_batched_tokens)
        self.max_model_len = None if max_model_len is None else _positive("max_model_len", max_model_len)
        self.requests: dict[str, Request] = {}      # live: waiting, preempted or running
        self.waiting: list[Request] = []            # preempted ones are put at the front
        self.running: list[Request] = []
        self._finished_ids: list[str] = []          # finished since the last schedule()
        self._ignored: dict[str, Request] = {}      # rejected at add_request, reported by update()
        self._limits: dict[str, tuple[int, int]] = {}   # (max_len, cap_end's fixed part), per live request
        self._placeheld: dict[str, Request] = {}    # requests holding a PLACEHOLDER token
        # multi-LoRA (set by the engine's builder): an AdapterPool of max_loras device slots
        # (toolkit/lora/pool.py); a running request holds its adapter's slot from admission
        # to its finish or preemption, so a step never runs more adapters than slots
        self.lora_pool = None
        self._lora_held: set[str] = set()

    @property
    def enable_prefix_caching(self) -> bool:
        return self.kv.enable_prefix_caching

    @property
    def num_lookahead_tokens(self) -> int:
        return self.kv.num_lookahead_tokens

    @property
    def capacity_blocks(self) -> int:
        return self.kv.capacity_blocks

    # -- limits --
    def blocks_for(self, num_tokens: int) -> int:
        return self.kv.blocks_for(num_tokens)

    def max_len(self, request: Request) -> int:
        """Longest the sequence may grow: max_model_len (scheduler's, request's) and the cache."""
        return self._limits_of(request)[0]

    def cap_end(self, request: Request) -> int:
        """Positions past this are never worth computing (max_len, or beyond max_tokens)."""
        return max(request.num_tokens, self._limits_of(request)[1])

    def _limits_of(self, request: Request) -> tuple[int, int]:
        """(max_len, the last position worth computing): fixed for a request's life, so
        computed once (they are read several times per request per step, on the hot path)."""
        lim = self._limits.get(request.request_id)
        if lim is None:
            cap = self.capacity_blocks * self.block_size
            for m in (self.max_model_len, request.max_model_len):
                if m is not None:
                    cap = min(cap, m)
            lim = (cap, min(cap, request.num_prompt_tokens + request.sampling_params.max_tokens - 1))
            if request.request_id in self.requests:     # only live requests are remembered
                self._limits[request.request_id] = lim
        return lim

    def never_fits(self, request: Request) -> str | None:
        """Why this request can never run here, or None."""
        p = request.num_prompt_tokens
        lim = [m for m in (self.max_model_len, request.max_model_len) if m is not None]
        if lim and p > min(lim):
            return f"prompt of {p} tokens exceeds max_model_len={min(lim)}"
        if request.prefill_whole and p > self.max_num_batched_tokens:
            return (f"prompt of {p} tokens exceeds max_num_batched_tokens={self.max_num_batched_tokens} "
                    "and must run in one step (bidirectional attention)")
        if self.blocks_for(p) > self.capacity_blocks:
            return (f"prompt of {p} tokens needs {self.blocks_for(p)} blocks of {self.block_size}; "
                    f"the cache has {self.capacity_blocks}")
        return None

    # -- the Scheduler protocol (schedule() is the subclass's) --
    def add_request(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise ValueError(f"add_request takes a toolkit.types.Request, got {type(request).__name__}")
        rid = request.request_id
        if rid in self.requests or rid in self._ignored:
            raise ValueError(f"request id {rid!r} is already queued; request ids must be unique")
        if request.block_ids or request.num_computed_tokens:
            raise ValueError(f"request {rid!r} already holds blocks or computed tokens; add a fresh Request")
        if self.never_fits(request) is not None:
            request.status = RequestStatus.FINISHED_IGNORED
            self._ignored[rid] = request
            self._finished_ids.append(rid)
            return
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.waiting.append(request)

    def abort(self, request_ids: Iterable[str]) -> None:
        """Finish these now (FINISHED_ABORTED) and free their blocks; unknown or finished ids
        are skipped. Aborted requests get no RequestOutput from update (the caller knows);
        they appear once in the next SchedulerOutput.finished_ids. A request rejected at
        add_request and not yet reported is dropped (its report too)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                self._finish(req, RequestStatus.FINISHED_ABORTED)
            elif self._ignored.pop(rid, None) is not None:
                self._finished_ids = [f for f in self._finished_ids if f != rid]

    def fork(self, request: Request, parent: Request) -> bool:
        """Start `request` (a sibling sample of `parent`: the same prompt) on parent's prompt
        blocks. This scheduler cannot (supports_fork = False): it returns False and the
        caller adds the request as usual."""
        return False

    def has_unfinished(self) -> bool:
        return bool(self.requests or self._ignored)

    def num_unfinished(self) -> int:
        return len(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def update(self, out: SchedulerOutput, result: StepResult | Mapping[str, Sequence[int]],
               ) -> list[RequestOutput]:
        """Apply one step's results (a StepResult, or a plain {request id: tokens} mapping).

        For each scheduled request that `samples`, `result.sampled_token_ids[id]` holds 1 to 1 + num_spec_tokens
        tokens: the accepted draft tokens followed by one sampled (bonus / correction) token.
        They are appended one by one with a stop check after each (the rest are dropped on a
        stop); then num_computed_tokens = num_tokens - 1 (the last token is not computed yet),
        which rolls back the rejected drafts. A request that did not sample (a prefill chunk)
        only advances num_computed_tokens to the chunk's end. Requests aborted since
        schedule() are skipped. Returns a RequestOutput for each request that got tokens or
        finished, including requests ignored at add_request (finish_reason "rejected"):
        those are reported by the first update after add_request whatever `out` holds, so a
        step that failed between schedule and update loses no report.
        """
        result = StepResult.of(result)
        sampled = result.sampled_token_ids
        live = [s for s in out.scheduled if self.requests.get(s.request_id) is s.request
                and s.request_id not in result.finished]
        for s in live:       # validate everything before changing anything
            if s.request.num_computed_tokens != s.start:
                raise ValueError(f"request {s.request_id!r} has {s.request.num_computed_tokens} computed tokens "
                                 f"but was scheduled from {s.start}; call update once per schedule, in order")
            if s.samples:
                toks = sampled.get(s.request_id)
                if not toks or len(toks) > 1 + s.num_spec_tokens:
                    raise ValueError(
                        f"request {s.request_id!r} sampled this step ({s.num_spec_tokens} draft tokens); "
                        f"sampled[{s.request_id!r}] must hold 1 to {1 + s.num_spec_tokens} tokens, got {toks!r}")
        outputs: list[RequestOutput] = []
        for rid, reason in result.finished.items():    # ended outside the scheduler (a grammar)
            req = self.requests.get(rid)
            if req is not None:
                self._finish(req, RequestStatus.FINISHED_STOPPED if reason == "stop"
                             else RequestStatus.FINISHED_GRAMMAR)
                outputs.append(RequestOutput(rid, [], True, reason, None))
        for s in live:
            outputs.extend(self._update_one(s, sampled.get(s.request_id, ())))
        for rid, req in self._ignored.items():
            outputs.append(RequestOutput(rid, [], True, req.status.finish_reason, None))
        self._ignored.clear()
        return outputs

    def resolve_placeholders(self, outputs: list[RequestOutput], result: StepResult) -> list[RequestOutput]:
        """Async scheduling. `outputs` came from an update() given one PLACEHOLDER token per
        sampling request (so the next schedule() could run before the tokens reached the
        host); `result` has the tokens. Each placeholder is replaced in the request and in
        its output. A token that stops its request (EOS, a stop id: stops that depend on the
        token's value; length stops were exact already) finishes it now: it may have been
        scheduled again meanwhile, and the update of that step drops it, as it drops any
        request finished since its schedule()."""
        fixed = []
        sampled = result.sampled_token_ids
        held = self._placeheld
        for o in outputs:            # (hot path: once per request per step)
            req = held.pop(o.request_id, None)
            if req is None or o.new_token_ids != [PLACEHOLDER]:
                fixed.append(o)
                continue
            tok = int(sampled[o.request_id][0])
            toks = req.output_token_ids
            i = len(toks) - 1            # the placeholder is the last token (nothing appends until now)
            while toks[i] != PLACEHOLDER:
                i -= 1
            toks[i] = tok
            if req.status is RequestStatus.FINISHED_ABORTED:
                continue                  # aborted since: no output (its id may be in use again)
            o.new_token_ids = [tok]       # the provisional output was never shown: fixed in place
            if i == len(toks) - 1 and check_stop(req, self._limits_of(req)[0]) is RequestStatus.FINISHED_STOPPED:
                if req.request_id in self.requests:
                    self._finish(req, RequestStatus.FINISHED_STOPPED)
                req.status = RequestStatus.FINISHED_STOPPED     # stop ids beat length on one token
                o.finished, o.finish_reason, o.stop_reason = True, "stop", req.stop_reason
            fixed.append(o)
        return fixed

    # -- helpers for subclasses --
    def _update_one(self, s: ScheduledRequest, tokens: Sequence[int]) -> list[RequestOutput]:
        # the engine's hot path (once per request per step): attributes read once, no properties
        req = s.request
        outs = req.output_token_ids
        end = s.start + s.num_new_tokens
        status = None
        if req.pooling_params is not None:                      # prefill-only: done at the prompt's end
            req.num_computed_tokens = end
            self.kv.publish(req)
            if end < len(req.prompt_token_ids):
                return []
            self._finish(req, RequestStatus.FINISHED_STOPPED)
            return [RequestOutput(req.request_id, [], True, "stop", None)]
        if end >= len(req.prompt_token_ids) + len(outs):       # s.samples
            max_len = self._limits_of(req)[0]
            new: list[int] = []
            for t in tokens:
                t = int(t)
                outs.append(t)
                new.append(t)
                if t == PLACEHOLDER:
                    self._placeheld[req.request_id] = req
                status = check_stop(req, max_len)
                if status is not None:
                    break
            req.num_computed_tokens = len(req.prompt_token_ids) + len(outs) - 1
        else:
            new = []
            req.num_computed_tokens = end
        drafted = bool(req.spec_token_ids)
        if drafted:
            req.spec_token_ids = []
        self.kv.publish(req)
        if status is not None:
            self._finish(req, status)
        elif drafted:
            self._after_update(req)
        if not new and status is None:
            return []
        if status is None:
            return [RequestOutput(req.request_id, new)]
        return [RequestOutput(req.request_id, new, True, status.finish_reason, req.stop_reason)]

    def _after_update(self, request: Request) -> None:
        """Hook: a live request's draft tokens were just verified (continuous trims the
        slots of rejected drafts here). Steps without drafts allocate no spare slots."""

    def _finish(self, req: Request, status: RequestStatus) -> None:
        self._free(req)
        self._lora_release(req)
        req.status = status
        rid = req.request_id
        del self.requests[rid]
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.kv.forget(rid)
        self._limits.pop(rid, None)
        self._finished_ids.append(rid)
        self._on_finish(req)

    def _free(self, req: Request) -> None:
        self.kv.free(req)

    # -- multi-LoRA: a running request holds its adapter's slot --
    def lora_fits(self, req: Request) -> bool:
        """Whether req's adapter can run now: none, already in a slot, or a slot is free (empty
        or holding an adapter no running request uses); else it waits (max_loras)."""
        lora, pool = req.lora_request, self.lora_pool
        if lora is None or pool is None:
            return True
        return pool.slot_of(lora.lora_int_id) is not None or pool.num_free_slots() > 0

    def _lora_acquire(self, req: Request) -> None:
        if req.lora_request is not None and self.lora_pool is not None and req.request_id not in self._lora_held:
            self.lora_pool.acquire(req.lora_request.lora_int_id)
            self._lora_held.add(req.request_id)

    def _lora_release(self, req: Request) -> None:
        if req.request_id in self._lora_held:
            self._lora_held.discard(req.request_id)
            self.lora_pool.release(req.lora_request.lora_int_id)

    def _lora_slots(self, out: SchedulerOutput) -> None:
        if self.lora_pool is not None:
            out.lora_slots = {s.request.lora_request.lora_int_id: self.lora_pool.slot_of(s.request.lora_request.lora_int_id)
                              for s in out.scheduled if s.request.lora_request is not None}

    def _on_finish(self, req: Request) -> None:
        """Hook: a queued request just finished (a policy's per-request state ends here)."""

    def _reject(self, req: Request) -> None:
        """Finish a queued request that has produced nothing as "rejected" (a policy's
        admission decision); the next update() reports it, as for one rejected at add."""
        assert not req.output_token_ids, "only a request with no output can be rejected"
        self._finish(req, RequestStatus.FINISHED_IGNORED)
        self._ignored[req.request_id] = req

    def _tick(self) -> None:
        """The step's time, read once so a policy's keys are consistent within a step."""
        self.now = self.clock()

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Preempt, requeue at the front. By swap (its computed blocks go to the host pool and
        come back when it is admitted again: KVCacheManager.swap_out) when `preemption` says
        so and the host pool has room; otherwise by recompute (free the blocks, forget
        progress). "auto" swaps a request with at least SWAP_MIN_TOKENS computed tokens."""
        swap = self.preemption == "swap" or (self.preemption == "auto"
                                             and req.num_computed_tokens >= SWAP_MIN_TOKENS)
        if not (swap and self.kv.swap_out(req, out)):
            self._free(req)
        self._lora_release(req)
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.running.remove(req)
        self.waiting.insert(0, req)
        out.preempted_ids.append(req.request_id)

    def _drain_finished(self) -> list[str]:
        ids, self._finished_ids = self._finished_ids, []
        return ids

    def _scheduled(self, req: Request, num_new_tokens: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        spec = max(0, start + num_new_tokens - req.num_tokens)
        return ScheduledRequest(req, start, num_new_tokens, list(req.block_ids), spec)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(running={len(self.running)}, waiting={len(self.waiting)}, "
                f"free_blocks={self.allocator.num_free_blocks()}/{self.allocator.num_blocks}, "
                f"max_num_seqs={self.max_num_seqs}, max_num_batched_tokens={self.max_num_batched_tokens})")

    def _repr_html_(self) -> str:
        from toolkit.schedulers.describe import scheduler_html

        return scheduler_html(self)
