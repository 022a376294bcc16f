"""Tensor parallelism on the GPUs (or CPU processes) of one host: `LLM(..., tensor_parallel_size=N)`.

    group.py     Group: the collectives one rank calls (all-reduce, broadcast, gather) over a
                 torch.distributed process group made without the global default group
    sharding.py  which tensor-parallel sizes a model allows
    model.py     build_shard: the model class TP=1 builds, with this rank's Group (its layers,
                 toolkit/models/layers/, hold and load the rank's slices)
    shard.py     ShardStep: one rank's part of an engine step (the same code on every rank)
    worker.py    the worker process (ranks 1..N-1): build, then run the steps it is sent
    executor.py  TPExecutor: rank 0 in the engine's process; starts and watches the workers
"""
