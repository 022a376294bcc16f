"""ContinuousBatchingScheduler: phase-free continuous batching (vLLM V1's rule).

Each step grants tokens so that `num_computed_tokens` catches up with
`num_tokens_with_spec`, within `max_num_batched_tokens` and `max_num_seqs`:
1. running requests, in policy order: a decode is 1 token (1 + drafts when
   `spec_token_ids` is set), an unfinished prefill or recompute gets what the budget
   leaves (a chunk). When blocks run out, the policy's victim among the not yet scheduled
   running requests is preempted by recompute; if the victim is the request itself it
   waits. Nothing is admitted in a step that preempted.
2. waiting requests, in the policy's admission order (preempted ones are requeued at the
   front), each first asked `policy.admit(req)` ("defer": after all the others; "reject":
   finished now): a prefix-cache hit over the full blocks (never the last token), then a
   chunk of the remaining budget (or, without chunked prefill, the whole rest or wait).
   Admission stops at the first request that does not fit (no overtaking: FCFS cannot
   starve).
The policy (toolkit/schedulers/policy_base.py) sees each grant (`on_grant`), each queued
request (`on_add`, after `check` accepted it) and each finish (`on_finish`).
"""

from __future__ import annotations

from typing import Any, Callable

from toolkit.schedulers.core import SchedulerCore
from toolkit.schedulers.policies import Policy, resolve_policy
from toolkit.schedulers.policy_base import ADMIT, REJECT, VERDICTS
from toolkit.schedulers.view import SchedulerView
from toolkit.types import Request, RequestFault, RequestStatus, ScheduledRequest, SchedulerOutput


class ContinuousBatchingScheduler(SchedulerCore):
    supports_async = True    # schedule() reads token counts, never token values
    supports_host_tier = True   # host_tier= / preemption="swap" (blocks/host_tier.py)
    supports_lora = True        # lora_pool: admission waits for a slot of the request's adapter

    def __init__(self, allocator, *, block_size: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                 policy: str | Policy | Any = "fcfs", enable_prefix_caching: bool = True,
                 enable_chunked_prefill: bool = True, num_lookahead_tokens: int = 0,
                 clock: Callable[[], float] | None = None, host_tier=None,
                 preemption: str = "auto") -> None:
        super().__init__(allocator, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                         enable_prefix_caching=enable_prefix_caching,
                         num_lookahead_tokens=num_lookahead_tokens, clock=clock,
                         host_tier=host_tier, preemption=preemption)
        self._view = SchedulerView(self)
        self.policy = resolve_policy(policy)
        self.policy.bind(self._view)
        self.enable_chunked_prefill = bool(enable_chunked_prefill)

    def set_policy(self, policy: str | Policy | Any) -> None:
        """Run another policy from now on (only while nothing is queued: a policy's state,
        e.g. fair-share counters, would not carry over). The new one is bound to this
        scheduler, its state reset."""
        if self.requests:
            raise ValueError(f"set_policy needs an idle scheduler; {len(self.requests)} requests are queued")
        self.policy = resolve_policy(policy)
        self.policy.bind(self._view)

    def _own_policy(self) -> None:
        """A policy object runs one scheduler at a time: if another scheduler (a simulation)
        bound it since, it is bound back here, its state reset."""
        if self.policy.view is not self._view:
            self.policy.bind(self._view)

    def add_request(self, request: Request) -> None:
        """Queue a request; a policy that needs a field the request lacks refuses it
        (ValueError), and nothing is queued."""
        self._own_policy()
        self.policy.check(request)
        super().add_request(request)
        if request.request_id in self.requests:
            try:
                self.policy.on_add(request)
            except BaseException:            # the policy refused it late: nothing stays queued
                del self.requests[request.request_id]
                self.waiting.remove(request)
                request.status = RequestStatus.WAITING
                raise

    def _on_finish(self, req: Request) -> None:
        self.policy.on_finish(req)

    def never_fits(self, request: Request) -> str | None:
        p = request.num_prompt_tokens
        if not self.enable_chunked_prefill and p > self.max_num_batched_tokens:
            return (f"prompt of {p} tokens exceeds max_num_batched_tokens={self.max_num_batched_tokens} "
                    "and chunked prefill is off")
        return super().never_fits(request)

    # -- n > 1: siblings on their parent's prompt blocks --
    supports_fork = True

    def fork(self, request: Request, parent: Request) -> bool:
        """Start `request` (a sibling sample: the same prompt) on `parent`'s prompt blocks.

        Each block gets ref += 1 instead of being computed again; the request computes only
        its last prompt token (for its logits), and the block that token lands in is copied
        first, on the device (SchedulerOutput.blocks_to_copy), since the parent writes its own
        tokens there. Returns False, changing nothing, when that cannot be done now: the
        parent is not running with its whole prompt computed, or the batch is full. The
        caller then adds the request as usual."""
        p = request.num_prompt_tokens
        if (parent.status is not RequestStatus.RUNNING or parent.num_computed_tokens < p
                or parent.request_id not in self.requests or request.request_id in self.requests
                or request.request_id in self._ignored or request.block_ids
                or request.num_computed_tokens or request.prompt_token_ids != parent.prompt_token_ids
                or len(self.running) >= self.max_num_seqs):
            return False
        self.kv.fork(request, parent, p)
        self._lora_acquire(request)          # the parent runs: its adapter is in a slot
        request.num_computed_tokens = request.num_cached_tokens = p - 1
        request.status = RequestStatus.RUNNING
        self.requests[request.request_id] = request
        self.running.append(request)
        return True

    # -- one step --
    def schedule(self) -> SchedulerOutput:
        self._tick()
        self._own_policy()
        out = SchedulerOutput(finished_ids=self._drain_finished())
        self.kv.begin_step(out)              # host-tier copies of this step are recorded in out
        try:
            self._schedule(out)
            self._lora_slots(out)
        except BaseException:
            # the step will not run: the finished ids it would have reported wait for the next
            self._finished_ids[:0] = out.finished_ids
            raise
        finally:
            self.kv.end_step()
        return out

    def _hook(self, method: str, request: Request, *args: Any) -> Any:
        """policy.<method>(request or its grant): a raise is that request's fault alone
        (RequestFault), so the engine ends only it."""
        try:
            return getattr(self.policy, method)(*(args or (request,)))
        except Exception as e:
            raise RequestFault([request.request_id],
                               f"the scheduling policy {self.policy!r} raised in {method} for request "
                               f"{request.request_id!r}: {type(e).__name__}: {e}") from e

    def _sorted_by(self, method: str, requests: list[Request]) -> list[Request]:
        try:                                  # the hot path: no per-request wrapper
            return sorted(requests, key=getattr(self.policy, method))
        except Exception:
            for r in requests:                # whose key raised: that request's fault
                self._hook(method, r)
            raise                             # keys that do not compare: the policy's, not one request's

    def _schedule(self, out: SchedulerOutput) -> None:
        budget = self.max_num_batched_tokens
        self.running[:] = self._sorted_by("sort_key", self.running)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            limit = self.cap_end(req)
            end = min(req.num_tokens_with_spec, limit, req.num_computed_tokens + budget)
            if not self._grow(req, end, i, out, limit):
                continue                       # req itself was preempted; running[i] is the next one
            n = end - req.num_computed_tokens
            out.scheduled.append(self._grant(self._scheduled(req, n)))
            budget -= n
            i += 1
        if not out.preempted_ids:
            self._admit_waiting(out, budget)

    def _grant(self, s: ScheduledRequest) -> ScheduledRequest:
        self._hook("on_grant", s.request, s)
        return s

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting requests in the policy's order; deferred ones go after all others."""
        queue = self._sorted_by("admission_key", self.waiting)
        deferred: list[Request] = []
        i, second_pass = 0, False
        while budget > 0 and len(self.running) < self.max_num_seqs:
            if i == len(queue):
                if second_pass or not deferred:
                    return
                queue, i, second_pass = deferred, 0, True     # best effort: the deferred ones
            req = queue[i]
            i += 1
            if not second_pass:
                verdict = self._hook("admit", req)
                if verdict not in VERDICTS:
                    raise ValueError(f"policy {self.policy!r}.admit returned {verdict!r}; valid: {VERDICTS}")
                if verdict == REJECT and not req.output_token_ids:
                    self._reject(req)
                    continue
                if verdict != ADMIT:       # DEFER (or REJECT of a request that has output)
                    deferred.append(req)
                    continue
            if not self.lora_fits(req):
                continue                   # its adapter would exceed max_loras: it waits, others go on
            s = self._admit(req, budget, out)
            if s is None:
                return                     # no overtaking
            out.scheduled.append(self._grant(s))
            budget -= s.num_new_tokens
            if self.policy.reorder_after_grant:
                queue[i:] = self._sorted_by("admission_key", queue[i:])

    def _grow(self, req: Request, end: int, i: int, out: SchedulerOutput, limit: int) -> bool:
        """Give req blocks up to `end` (+ lookahead, never past `limit`), preempting policy
        victims among running[i:] as needed. False if req itself was preempted."""
        while not self.kv.allocate_slots(req, end, limit=limit, out=out):
            candidates = self.running[i:]
            victim = self._victim(req, candidates)
            self._preempt(victim, out)
            if victim is req:
                return False
        return True

    def _victim(self, req: Request, candidates: list[Request]) -> Request:
        """policy.victim(candidates), made room for req. A raise or a choice outside the
        candidates is charged to req, the request that needed the room (RequestFault): the
        engine ends it, which frees its blocks, and the others go on."""
        try:
            victim = self.policy.victim(candidates)
        except Exception as e:
            raise RequestFault([req.request_id],
                               f"the scheduling policy {self.policy!r} raised in victim while making "
                               f"room for request {req.request_id!r}: {type(e).__name__}: {e}") from e
        if not any(victim is c for c in candidates):
            raise RequestFault([req.request_id],
                               f"the scheduling policy {self.policy!r} chose "
                               f"{getattr(victim, 'request_id', victim)!r} as the victim while making "
                               f"room for request {req.request_id!r}, which is not one of the "
                               "candidates it was given")
        return victim

    def _admit(self, req: Request, budget: int, out: SchedulerOutput) -> ScheduledRequest | None:
        hits = self.kv.admission_hits(req)   # device prefix hit, host tier, or its swapped-out KV
        computed = hits.num_computed_tokens
        n = req.num_tokens - computed
        if n > budget:
            # without chunking a request waits for a step it fits in whole; one that never
            # fits a step (a recompute grown past the budget) is chunked anyway
            if (not self.enable_chunked_prefill or req.prefill_whole) and n <= self.max_num_batched_tokens:
                self.kv.release(hits)
                return None
            n = budget
        if not self.kv.allocate_slots(req, computed + n, limit=self.cap_end(req), hits=hits, out=out):
            self.kv.release(hits)
            return None
        req.num_computed_tokens = req.num_cached_tokens = computed
        req.status = RequestStatus.RUNNING
        self.waiting.remove(req)
        self.running.append(req)
        self._lora_acquire(req)
        return self._scheduled(req, n)

    def _after_update(self, req: Request) -> None:
        """Free tail blocks no longer needed (rolled-back draft slots beyond the lookahead)."""
        self.kv.trim(req, req.num_tokens, limit=self.cap_end(req))
