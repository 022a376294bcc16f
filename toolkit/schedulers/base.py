"""The Scheduler contract. Schedulers import only the block layer and the shared types,
so a policy runs on a simulated clock with no GPU and no model."""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

from toolkit.types import Request, RequestOutput, SchedulerOutput, StepResult


@runtime_checkable
class Scheduler(Protocol):
    """Required: the five methods below. Declared capabilities, with their defaults (the
    engine reads them once, when it is assembled; `SchedulerCore` provides all of them):

    - `supports_fork: bool = False`. True: `fork(request, parent) -> bool` starts a sibling
      sample (the same prompt, n > 1) on parent's prompt blocks, or returns False changing
      nothing; the engine then adds it as a new request.
    - `supports_async: bool = False`. True: schedule() may run once ahead of the previous
      step's tokens: update() takes one `PLACEHOLDER` token per sampling request, and
      `resolve_placeholders(outputs, result) -> outputs` puts the real tokens in their place
      one step later (finishing now a request whose token stops it). Without it the engine
      runs the synchronous loop.
    - `supports_host_tier: bool = False`. True: the constructor takes `host_tier=` and
      `preemption=` ("auto" | "swap" | "recompute"), and `kv.host` is the tier it was given
      (the engine refuses cpu_cache_gb / preemption="swap" for a scheduler without it).
    - `num_running`, `num_waiting`: queue lengths, read by step records (observers).
    """

    def add_request(self, request: Request) -> None: ...

    def abort(self, request_ids: Iterable[str]) -> None:
        """Finish these requests now and free their blocks."""

    def schedule(self) -> SchedulerOutput: ...

    def update(self, out: SchedulerOutput,
               result: StepResult | Mapping[str, Sequence[int]]) -> list[RequestOutput]:
        """Finish the requests in result.finished; append the sampled tokens of the requests
        that sampled; apply token-level stops (EOS, max_tokens, stop ids, max_model_len) and
        free finished requests' blocks."""

    def has_unfinished(self) -> bool: ...
