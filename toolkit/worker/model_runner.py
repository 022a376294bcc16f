"""ModelRunner: one rank's forward of an engine step, the same code at TP=1 and on every
tensor-parallel rank.

    copy-on-write block copies -> attention.plan(layout) -> the model's forward (eager, or a
    replay of its CUDA graphs: worker/cuda_graphs.py) -> the logits of the rows that sample

A tensor-parallel rank differs only in its model's layers (their collectives) and in how its
inputs arrive (toolkit/parallel/shard.py); a rank other than 0 gets None for the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from toolkit.blocks.layout import PagedKVLayout


@dataclass
class ForwardInputs:
    layout: PagedKVLayout
    input_ids: torch.Tensor            # int64 [T] on the device
    positions: torch.Tensor            # int64 [T]
    graph_batch: int | None = None     # the CUDA-graph bucket the step is padded to
    blocks_to_copy: list[tuple[int, int]] | None = None   # copy-on-write (src, dst), before the forward


class ModelRunner:
    def __init__(self, model: Any, attention: Any, kv_cache: Any, device: torch.device,
                 copy_backend: str = "auto") -> None:
        self.model, self.attention, self.kv_cache, self.device = model, attention, kv_cache, device
        self.copy_backend = copy_backend  # "torch": the block copies' reference twin
        self.graphs = None               # StepGraphs, after enable_cuda_graphs

    def enable_cuda_graphs(self, max_tokens: int, full_tokens: int | None = None) -> bool:
        """Replay steps of up to max_tokens tokens from CUDA graphs (CUDA + a backend with
        run(out=)): piecewise graphs, and whole-forward graphs for decode steps of up to
        full_tokens (None: every bucket). A tensor-parallel rank's graphs hold its all-reduces."""
        from toolkit.worker.cuda_graphs import StepGraphs, supports_graphs

        if self.device.type != "cuda" or not supports_graphs(self.attention):
            return False
        self.graph_args = (max_tokens, full_tokens)      # sleep mode rebuilds them on wake
        self.graphs = StepGraphs(self.model, self.attention, max_tokens, self.device, full_tokens)
        return True

    @torch.inference_mode()
    def forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """hidden [T, hidden] of the step's tokens."""
        if inputs.blocks_to_copy:         # shared blocks the step writes to: private copies first
            from toolkit.kernels.dispatch import copy_blocks

            src, dst = (torch.tensor(x, dtype=torch.int64).to(self.device, non_blocking=True)
                        for x in zip(*inputs.blocks_to_copy))
            copy_blocks(self.kv_cache.layers, src, dst, backend=self.copy_backend)
        self.attention.plan(inputs.layout)
        bp, graphs = inputs.graph_batch, self.graphs
        if bp is not None and graphs is not None and graphs.captured(bp):
            return graphs.replay(bp, inputs.input_ids, inputs.positions, inputs.layout.slot_mapping)
        hidden = self.model.forward(inputs.input_ids, inputs.positions, self.attention)   # [T, hidden]
        if bp is not None and graphs is not None:
            graphs.capture(bp)            # the eager run above compiled every kernel of this shape
        return hidden

    @torch.inference_mode()
    def step(self, inputs: ForwardInputs, rows: torch.Tensor | None, prompt_rows: torch.Tensor | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """One step on this rank: forward, then logits(). (logits [N, V] (rows None: None, no
        LM head), prompt logits [P, V] or None, hidden [T, hidden]); the hidden states are whole
        on every rank (the residual stream is all-reduced, the final norm replicated), so rank
        0's feed the pooler."""
        hidden = self.forward(inputs)
        return (*self.logits(hidden, rows, prompt_rows), hidden)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, rows: torch.Tensor | None, prompt_rows: torch.Tensor | None = None
               ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits [N, V] of hidden's rows `rows`, logits [P, V] of `prompt_rows` or None): float32
        on rank 0, None on the other ranks of a tensor-parallel group. N = 0 runs no collective;
        rows None (this process's LM head not wanted: a sampler graph runs it) gives None."""
        prompt = self.model.compute_logits(hidden[prompt_rows]) if prompt_rows is not None and len(prompt_rows) else None
        if rows is None:
            return None, prompt
        if len(rows):
            return self.model.compute_logits(hidden[rows]), prompt
        group = getattr(self.model, "group", None)
        rank0 = group is None or group.rank == 0
        empty = torch.empty(0, self.model.spec.vocab_size, dtype=torch.float32, device=self.device)
        return (empty if rank0 else None), prompt
