"""ConnectorScheduler: the continuous scheduler with a KV connector's hooks.

What a connector adds to a step (vLLM V1's states and calls):
- admission: after the local prefix hit (device + host tier), the connector says how many
  more tokens it can load (`get_num_new_matched_tokens`). Synchronous: the request is
  scheduled now, its blocks are filled before this step's forward. Asynchronous: it gets
  its blocks, leaves the queue as WAITING_FOR_REMOTE_KVS and admission goes on with the
  next request; the steps go on without it.
- the worker's report (StepResult.kv_connector_output), read in update(): a request whose
  load finished goes back to the front of the queue holding its blocks and computed
  tokens (its full blocks published in the prefix cache), or, when any of its blocks
  failed to load, with neither: it is recomputed, and the connector is not asked again. A
  request whose synchronous load failed loses the step it ran on those blocks (no token,
  nothing published) and is recomputed the same way.
- finish: `request_finished(request, block_ids)`; delay_free=True keeps the blocks
  allocated until the connector reports the save done. A request aborted while loading
  keeps its blocks until the load is over (it writes into them). has_unfinished() stays
  True while blocks are held, so the engine steps until they are freed.
Nothing here runs without a connector: build_engine picks this class only when
EngineConfig.kv_connector / kv_cache_dir is set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.types import (
    Request,
    RequestFault,
    RequestStatus,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
)

WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS


class ConnectorScheduler(ContinuousBatchingScheduler):
    supports_kv_connector = True

    def __init__(self, allocator, *, kv_connector: Any, **kwargs: Any) -> None:
        super().__init__(allocator, **kwargs)
        for m in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                  "request_finished"):
            if not callable(getattr(kv_connector, m, None)):
                raise TypeError(f"kv_connector {kv_connector!r} lacks {m}(); see toolkit/kv_transfer/base.py")
        self.connector = kv_connector
        self.remote: dict[str, Request] = {}          # WAITING_FOR_REMOTE_KVS: request -> its blocks load
        self._remote_tokens: dict[str, int] = {}      # computed tokens once its load lands
        self._arrived: set[str] = set()               # loaded, queued again with its blocks
        self._held: dict[str, list[int]] = {}         # finished; blocks freed when the transfer ends
        self._no_connector: set[str] = set()          # a load failed: recomputed, not asked again
        self._parked = 0                              # requests parked by the current admission pass
        self.num_remote_loads = self.num_failed_loads = self.num_delayed_frees = 0

    def add_request(self, request: Request) -> None:
        if request.request_id in self._held:
            raise ValueError(f"request id {request.request_id!r} is still transferring its KV (a finished "
                             "request's save or an aborted request's load); use another id or wait a step")
        super().add_request(request)

    # -- the step --
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """The continuous admission, resumed after each request parked for an async load."""
        while True:
            parked, before = self._parked, out.total_num_scheduled_tokens
            super()._admit_waiting(out, budget)
            budget -= out.total_num_scheduled_tokens - before
            if not self.running and not self.remote and self._arrived and self._unload_arrived():
                continue                      # their blocks stood in the way of the queue's head
            if self._parked == parked or budget <= 0:
                return

    def _unload_arrived(self) -> bool:
        """Nothing runs or loads and the queue is stuck: loaded requests waiting for their
        turn give their blocks back (the full ones stay in the prefix cache) and start over."""
        for rid in list(self._arrived):
            req = self.requests[rid]
            self.kv.free(req)
            req.num_computed_tokens = 0
        self._arrived.clear()
        return True

    def _admit(self, req: Request, budget: int, out: SchedulerOutput) -> ScheduledRequest | None:
        rid = req.request_id
        if rid in self._arrived:
            return self._admit_arrived(req, budget, out)
        if rid in self._no_connector or self.kv.is_swapped(rid):
            return super()._admit(req, budget, out)
        hits = self.kv.admission_hits(req)
        computed = hits.num_computed_tokens
        try:
            ext, is_async = self.connector.get_num_new_matched_tokens(req, computed)
            if not isinstance(ext, int) or ext < 0 or computed + ext > req.num_tokens - 1:
                raise ValueError(f"matched {ext!r} tokens after {computed} computed ones; valid: an int "
                                 f"in [0, {req.num_tokens - 1 - computed}]")
        except Exception as e:          # the connector's fault for this request: the engine ends it alone
            self.kv.release(hits)
            raise RequestFault([rid], f"kv connector {self.connector!r} failed for request {rid!r}: "
                                      f"{type(e).__name__}: {e}") from e
        if ext == 0:
            self.kv.release(hits)
            return super()._admit(req, budget, out)
        if is_async:
            if (len(self.running) + len(self.remote) >= self.max_num_seqs
                    or not self.kv.allocate_slots(req, computed + ext, limit=self.cap_end(req), hits=hits, out=out)):
                self.kv.release(hits)
                return None
            self.connector.update_state_after_alloc(req, list(req.block_ids), ext)
            self.waiting.remove(req)
            req.status = WAITING_FOR_REMOTE_KVS
            self.remote[rid] = req
            self._remote_tokens[rid] = computed + ext
            self._parked += 1
            self.num_remote_loads += 1
            return None                       # _admit_waiting goes on with the next request
        n = self._chunk(req.num_tokens - computed - ext, budget)
        if n is None or not self.kv.allocate_slots(req, computed + ext + n, limit=self.cap_end(req),
                                                   hits=hits, out=out):
            self.kv.release(hits)
            return None
        self.connector.update_state_after_alloc(req, list(req.block_ids), ext)
        return self._run(req, computed + ext, n)

    def _admit_arrived(self, req: Request, budget: int, out: SchedulerOutput) -> ScheduledRequest | None:
        """A request whose async load landed: it holds its blocks and computed tokens."""
        n = self._chunk(req.num_tokens - req.num_computed_tokens, budget)
        if n is not None and self.kv.allocate_slots(req, req.num_computed_tokens + n,
                                                    limit=self.cap_end(req), out=out):
            self._arrived.discard(req.request_id)
            return self._run(req, req.num_computed_tokens, n)
        return None

    def _chunk(self, n: int, budget: int) -> int | None:
        if n > budget:
            if not self.enable_chunked_prefill and n <= self.max_num_batched_tokens:
                return None
            n = budget
        return n

    def _run(self, req: Request, computed: int, n: int) -> ScheduledRequest:
        req.num_computed_tokens = req.num_cached_tokens = computed
        req.status = RequestStatus.RUNNING
        self.waiting.remove(req)
        self.running.append(req)
        self._lora_acquire(req)              # its adapter's slot, as the base scheduler's admission
        return self._scheduled(req, n)

    # -- the worker's report --
    def update(self, out: SchedulerOutput, result: Any) -> list:
        result = StepResult.of(result)
        kvo = getattr(result, "kv_connector_output", None)
        if kvo is not None:
            out = self._drop_failed_sync_loads(out, result, kvo.invalid_block_ids)
            self._on_transfers(kvo)
        return super().update(out, result)

    def _drop_failed_sync_loads(self, out: SchedulerOutput, result: StepResult, bad: set) -> SchedulerOutput:
        """A request scheduled this step on blocks whose synchronous load failed computed on
        garbage: this step's work for it is dropped (not published, no token) and it is
        recomputed from scratch, without the connector."""
        victims = {s.request_id for s in out.scheduled
                   if s.request_id not in self.remote and bad.intersection(s.request.block_ids)}
        if not victims:
            return out
        for rid in victims:
            req = self.requests[rid]
            self.kv.free(req)
            req.num_computed_tokens = 0
            req.spec_token_ids = []
            req.status = RequestStatus.WAITING
            self.running.remove(req)
            self.waiting.insert(0, req)
            self._no_connector.add(rid)
            self.num_failed_loads += 1
            result.sampled_token_ids.pop(rid, None)
        return dataclasses.replace(out, scheduled=[s for s in out.scheduled if s.request_id not in victims])

    def _on_transfers(self, kvo: Any) -> None:
        bad = set(kvo.invalid_block_ids)
        for rid in kvo.finished_recving:
            req = self.remote.pop(rid, None)
            computed = self._remote_tokens.pop(rid, 0)
            if req is None:
                self._release(rid)            # aborted while loading: its blocks are free now
                continue
            if bad.intersection(req.block_ids):
                self.kv.free(req)             # nothing of it is trusted: recompute from scratch
                req.num_computed_tokens = 0
                self._no_connector.add(rid)
                self.num_failed_loads += 1
            else:
                req.num_computed_tokens = computed
                self.kv.publish(req)
                self._arrived.add(rid)
            req.status = RequestStatus.WAITING
            self.waiting.insert(0, req)
        for rid in kvo.finished_sending:
            self._release(rid)

    def _release(self, rid: str) -> None:
        blocks = self._held.pop(rid, None)
        if blocks:
            self.allocator.free(list(reversed(blocks)))

    # -- finish --
    def _finish(self, req: Request, status: RequestStatus) -> None:
        rid = req.request_id
        loading = self.remote.pop(rid, None) is not None
        self._remote_tokens.pop(rid, None)
        self._arrived.discard(rid)
        self._no_connector.discard(rid)
        req.status = status
        delay, _params = self.connector.request_finished(req, list(req.block_ids))
        if (delay or loading) and req.block_ids:
            self._held[rid] = req.block_ids   # still referenced; freed by _release
            req.block_ids = []
            self.num_delayed_frees += 1
        super()._finish(req, status)

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self._held)

    def num_held_blocks(self) -> int:
        """Blocks of finished requests whose transfer is still running."""
        return sum(len(b) for b in self._held.values())

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] + f", remote={len(self.remote)}, held_blocks={self.num_held_blocks()}, "
                f"connector={self.connector!r})")
