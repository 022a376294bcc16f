"""KV transfer: moving KV blocks between an engine and storage or another engine.

The contract (`base.KVConnectorBase`) has vLLM V1's shape: a scheduler side that says how
many of a waiting request's tokens can be loaded from outside, which blocks to fill and
whether a finished request's blocks are still being saved; a worker side that loads,
saves and reports finished transfers. `scheduler.ConnectorScheduler` is the continuous
scheduler with the connector's hooks (WAITING_FOR_REMOTE_KVS, delayed frees);
`worker.connector_step` is the runner's one call per step.

Connectors: `store.StoreConnector` over a `MemoryKVStore` (the reference twin) or a
`DiskKVStore` (memory-mapped files, the disk tier); `pd.PDConnector` hands a prefilled
request's KV from a producer engine to a consumer engine (prefill/decode disaggregation).
"""
