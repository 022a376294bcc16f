"""The runner's one call per step into a connector's worker side.

Called before the step reads or writes any block (after the host tier's swaps, which may
save a block that this step's load then overwrites), also on steps that schedule nothing,
so transfers finish while the engine only waits for them.
"""

from __future__ import annotations

from typing import Any

from toolkit.kv_transfer.base import KVConnectorOutput


def connector_step(connector: Any, out: Any, num_layers: int) -> KVConnectorOutput:
    """Bind the step's metadata, load (waiting for every layer), save every layer, and
    collect what finished."""
    connector.bind_connector_metadata(getattr(out, "kv_connector_metadata", None))
    try:
        connector.start_load_kv()
        for i in range(num_layers):
            connector.wait_for_layer_load(i)
        for i, layer in enumerate(connector.kv_layers):
            connector.save_kv_layer(i, layer)
        connector.wait_for_save()
        sending, recving = connector.get_finished(set(out.finished_ids))
        errors = connector.get_block_ids_with_load_errors()
    finally:
        connector.clear_connector_metadata()
    return KVConnectorOutput(set(sending or ()), set(recving or ()), set(errors or ()))
