"""One rank's part of an engine step under tensor parallelism: what reaches it, and `run_rank`.

Rank 0 (the engine's process) sends each worker a `StepMsg` over its pipe: the step's
PagedKVLayout (host arrays), how many rows sample, the CUDA-graph bucket and the
copy-on-write block pairs. The token ids, positions and row indices travel by one collective
broadcast from rank 0's device instead, because with async scheduling some input ids exist
only there (gathered on the device from the last step's tokens). Then every rank runs the
ModelRunner TP=1 runs (toolkit/worker/model_runner.py: block copies, attention planned over its
KV heads, its shard of the forward, eager or from CUDA graphs that hold the NCCL all-reduces)
and joins the gather of the logits rows; rank 0 gets the logits [N, V], and its hidden
states [T, H] are whole (all-reduced, then the replicated final norm): a pooling step's
Pooler reads them in rank 0's process, as at TP=1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from toolkit.blocks.kv_cache import KVCache
from toolkit.blocks.layout import PagedKVLayout
from toolkit.parallel.group import Group
from toolkit.worker.model_runner import ForwardInputs, ModelRunner


@dataclass
class StepMsg:
    """What a worker needs of a step besides the broadcast ids (numpy only: a torch tensor
    sent through a multiprocessing pipe would be moved to shared memory first)."""
    layout: dict[str, Any]                 # PagedKVLayout's fields; index tensors as numpy arrays
    num_rows: int                          # N: rows whose logits are sampled
    num_prompt_rows: int                   # P: rows whose logits give prompt logprobs
    graph_batch: int | None                # the CUDA-graph bucket the step is padded to
    blocks_to_copy: list[tuple[int, int]] | None
    lora: Any = None                       # LoRAStep: the step's slot loads and per-token slots

    @classmethod
    def of(cls, batch: Any, num_rows: int | None = None) -> "StepMsg":
        """num_rows: the sampling rows whose logits are gathered (None: all of batch.logits_indices)."""
        host = batch.layout.host
        fields = {f.name: getattr(host, f.name) for f in dataclasses.fields(host) if f.name != "host_copy"}
        n = int(batch.logits_indices.shape[0]) if num_rows is None else num_rows
        return cls({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in fields.items()},
                   n, len(batch.prompt_rows or ()), batch.graph_batch,
                   batch.blocks_to_copy, getattr(batch, "lora", None))

    def layout_on(self, device: torch.device) -> PagedKVLayout:
        host = PagedKVLayout(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                for k, v in self.layout.items()})
        return host if device.type == "cpu" else host.to(device)   # .to keeps the host copy


def run_rank(runner: ModelRunner, group: Group, msg: StepMsg, layout: PagedKVLayout,
             packed: torch.Tensor | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """One rank's part of a step: the broadcast of the step's ids, then the ModelRunner step
    every rank (and TP=1) runs. (logits [N, V], prompt logits [P, V] or None, hidden [T, H]) on
    rank 0; (None, None, hidden) elsewhere. packed: rank 0's int64 [2T + N + P] = input ids,
    positions, logits rows, prompt rows."""
    t, n, p = layout.num_tokens, msg.num_rows, msg.num_prompt_rows
    if packed is None:
        packed = torch.empty(2 * t + n + p, dtype=torch.int64, device=runner.device)
    group.broadcast(packed, 0)
    ids, positions, rows, prompt_rows = packed.split([t, t, n, p])
    return runner.step(ForwardInputs(layout, ids, positions, msg.graph_batch, msg.blocks_to_copy),
                       rows, prompt_rows if p else None)


def kv_blocks_fit(model: Any, block_size: int, dtype: torch.dtype, device: torch.device, *,
                  num_blocks: int | None, budget_bytes: int | None, gpu_memory_utilization: float,
                  cpu_budget: int, profile_step: tuple[int, int] = (0, 0)) -> int:
    """How many KV blocks of this rank's heads fit its budget (num_blocks when forced): the
    budget is per rank (per GPU), like gpu_memory_utilization, and leaves room for the
    activations of the largest step (profile_step: tokens, logits rows), measured on every
    rank at once (worker/memory_profile.py)."""
    if num_blocks is not None:
        return num_blocks
    per_block = KVCache.bytes_per_block(model.spec.num_layers, block_size, model.spec.num_kv_heads,
                                        model.spec.head_dim, dtype)
    if budget_bytes is None:
        if device.type == "cuda":
            from toolkit.worker.memory_profile import activation_peak_bytes, kv_budget_bytes

            peak = activation_peak_bytes(model, *profile_step, device)
            free, _ = torch.cuda.mem_get_info(device)
            budget_bytes = kv_budget_bytes(free, gpu_memory_utilization, peak)
        else:
            budget_bytes = cpu_budget
    return int(budget_bytes // per_block)


def make_kv_and_attention(model: Any, attention: Any, num_blocks: int, block_size: int,
                          dtype: torch.dtype, device: torch.device) -> tuple[KVCache, Any]:
    """This rank's KV cache (its KV heads, every rank the same number of blocks) and its
    attention backend (built from a registered name, class or factory: never an instance)."""
    from toolkit.attention.layerwise import build_attention
    from toolkit.registry import create_part

    spec = model.spec
    kv = KVCache(spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim, dtype, device)
    return kv, build_attention(spec, partial(create_part, "attention", attention, kv_cache=kv))
