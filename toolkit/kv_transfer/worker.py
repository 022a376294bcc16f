"""The runner's one call per step into a connector's worker side.

Called before the step reads or writes any block (after the host tier's swaps, which may
save a block that this step's load then overwrites), also on steps that schedule nothing,
so transfers finish while the engine only waits for them. Such a step, when it gives the
connector no new work either, blocks in the connector's wait_for_transfers until a
transfer in flight finishes (at most IDLE_WAIT_S) instead of returning at once: an engine
whose only requests wait for a load (WAITING_FOR_REMOTE_KVS) or a save would otherwise
spin through empty steps (hundreds of thousands a second-long disk load, each taking the
GIL from the I/O thread that does the load).
"""

from __future__ import annotations

from typing import Any

from toolkit.kv_transfer.base import KVConnectorOutput

# the longest an idle step waits for a transfer: it returns as soon as one finishes, so this
# only bounds how late the loop sees what else may change meanwhile (a request added or
# aborted from another thread)
IDLE_WAIT_S = 0.005


def is_idle(out: Any, meta: Any) -> bool:
    """A step (SchedulerOutput) that schedules nothing, finishes nothing and carries no
    connector work (KVConnectorMetadata.has_work)."""
    return not out.scheduled and not out.finished_ids and (meta is None or not meta.has_work())


def connector_step(connector: Any, out: Any, num_layers: int, *,
                   idle_wait_s: float | None = None) -> KVConnectorOutput:
    """Bind the step's metadata, load (waiting for every layer), save every layer, wait a
    little for a transfer when the step is idle (idle_wait_s; None: IDLE_WAIT_S when
    is_idle(out, metadata), else 0), and collect what finished."""
    meta = out.kv_connector_metadata
    if idle_wait_s is None:
        idle_wait_s = IDLE_WAIT_S if is_idle(out, meta) else 0.0
    connector.bind_connector_metadata(meta)
    try:
        connector.start_load_kv()
        for i in range(num_layers):
            connector.wait_for_layer_load(i)
        for i, layer in enumerate(connector.kv_layers):
            connector.save_kv_layer(i, layer)
        connector.wait_for_save()
        if idle_wait_s > 0:                  # declared by KVConnectorBase (default: no wait)
            connector.wait_for_transfers(idle_wait_s)
        sending, recving = connector.get_finished(set(out.finished_ids))
        errors = connector.get_block_ids_with_load_errors()
    finally:
        connector.clear_connector_metadata()
    return KVConnectorOutput(set(sending or ()), set(recving or ()), set(errors or ()))
