"""Tensor parallelism on the GPUs (or CPU processes) of one host: `LLM(..., tensor_parallel_size=N)`.

    group.py     Group: the collectives one rank calls (all-reduce, broadcast, gather) over a
                 torch.distributed process group made without the global default group
    layers.py    how a dimension is split (Partition), column- / row-parallel linear layers,
                 the vocabulary-parallel embedding and LM head
    sharding.py  which slice of each checkpoint tensor a rank holds (TPShape), the checks of N
    model.py     ShardedLlama: the Llama-family decoder on one rank; loading its slices from a
                 Hugging Face folder or from the full random model TP=1 would draw
    shard.py     ShardStep: one rank's part of an engine step (the same code on every rank)
    worker.py    the worker process (ranks 1..N-1): build, then run the steps it is sent
    executor.py  TPExecutor: rank 0 in the engine's process; starts and watches the workers
"""
