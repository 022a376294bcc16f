"""KVConnectorBase: the contract of a KV connector, in vLLM V1's shape (KVConnectorBase_V1).

Scheduler side (called by the scheduler, integers and requests only):
    get_num_new_matched_tokens(request, num_computed_tokens) -> (n, load_async)
        tokens after the local prefix hit (num_computed_tokens) that can be loaded from
        outside; load_async=True: the request waits (WAITING_FOR_REMOTE_KVS) while they
        load and the steps go on without it; False: they load in the next step, before its
        forward. Never the last token of the request (one token is computed for logits).
    update_state_after_alloc(request, block_ids, num_external_tokens)
        the request's block table now covers them: remember which blocks to fill.
    build_connector_meta(scheduler_output) -> KVConnectorMetadata
        everything the worker side needs for this step (the only scheduler -> worker
        channel); the scheduler puts it in SchedulerOutput.kv_connector_metadata.
    request_finished(request, block_ids) -> (delay_free, kv_transfer_params)
        delay_free=True: the blocks are being saved; the scheduler frees them only when
        get_finished reports the request in finished_sending.

Worker side (called by the runner once per step, before the forward):
    register_kv_caches(layers)       the device KV cache, per layer [2, num_blocks, bs, H, D]
    bind_connector_metadata(meta) / clear_connector_metadata()
    start_load_kv()                  start the step's loads
    wait_for_layer_load(layer)       a synchronous load of this layer is done
    save_kv_layer(layer, kv_layer)   start saving this layer's blocks of the step's saves
    wait_for_save()                  the step's saves may still run, but hold their own copies
    get_finished(finished_req_ids) -> (finished_sending, finished_recving)
        request ids whose saves / asynchronous loads completed since the last call
    get_block_ids_with_load_errors() -> set[int]
        device blocks whose load failed since the last call (their requests are recomputed)
    wait_for_transfers(timeout_s)
        block until a transfer in flight finishes (or timeout_s passes); the runner calls it,
        before get_finished, on a step that schedules nothing and gives the connector no new
        work, so an engine that only waits for its transfers does not spin (the default
        returns at once)
    close()                          finish / stop what is in flight and drop the device
        KV cache (kv_layers): a closed engine's memory must not stay referenced by its connector

The toolkit's forward is not split per layer for connectors: the runner calls
wait_for_layer_load for every layer before the forward and save_kv_layer for every layer
after the loads (the blocks saved are a finished request's, computed in earlier steps).
A connector may still overlap its I/O with the steps through asynchronous loads and saves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class KVConnectorMetadata:
    """What the scheduler side tells the worker side for one step (a connector subclasses it)."""

    def has_work(self) -> bool:
        """Whether the step gives the worker side loads or saves to start (False lets an idle
        step wait for transfers in flight; a subclass that cannot tell keeps True)."""
        return True


@dataclass
class KVConnectorOutput:
    """What the worker side reports to the scheduler after a step (StepResult.kv_connector_output)."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)    # loads that failed

    def __bool__(self) -> bool:
        return bool(self.finished_sending or self.finished_recving or self.invalid_block_ids)


class KVConnectorBase(ABC):
    """Subclass and implement the abstract methods; the others have working defaults."""

    def __init__(self) -> None:
        self._meta: KVConnectorMetadata | None = None
        self.kv_layers: list[Any] = []

    # -- scheduler side --
    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata: ...

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> tuple[bool, dict | None]:
        return False, None

    # -- worker side --
    def register_kv_caches(self, layers: Sequence[Any]) -> None:
        self.kv_layers = list(layers)

    def bind_connector_metadata(self, meta: KVConnectorMetadata | None) -> None:
        self._meta = meta

    def clear_connector_metadata(self) -> None:
        self._meta = None

    def _get_connector_metadata(self) -> KVConnectorMetadata | None:
        return self._meta

    @abstractmethod
    def start_load_kv(self) -> None: ...

    def wait_for_layer_load(self, layer: int) -> None:
        return None

    def save_kv_layer(self, layer: int, kv_layer: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def wait_for_transfers(self, timeout_s: float) -> None:
        """Block until a transfer in flight finishes, at most timeout_s (nothing to wait for:
        return at once)."""

    def close(self) -> None:
        """Release what the connector holds (threads, temporary files) and its references to
        the device KV cache. A subclass that overrides it calls super().close()."""
        self.kv_layers = []
        self._meta = None
