"""The Scheduler contract. Schedulers import only the block layer and the shared types,
so a policy runs on a simulated clock with no GPU and no model."""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol, runtime_checkable

from toolkit.types import Request, RequestOutput, SchedulerOutput


@runtime_checkable
class Scheduler(Protocol):
    def add_request(self, request: Request) -> None: ...

    def abort(self, request_ids: Iterable[str]) -> None:
        """Finish these requests now and free their blocks."""

    def schedule(self) -> SchedulerOutput: ...

    def update(self, out: SchedulerOutput, sampled: Mapping[str, list[int]]) -> list[RequestOutput]:
        """Append the sampled tokens of the requests that sampled; apply token-level stops
        (EOS, max_tokens, stop ids, max_model_len) and free finished requests' blocks."""

    def has_unfinished(self) -> bool: ...
