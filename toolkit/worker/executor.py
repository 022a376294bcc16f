"""Executor: runs a prepared step's forward wherever the model lives.

    execute(batch, hidden=False) -> ForwardOutput   logits [N, V] of the sampling rows and
                                                   prompt-logprob rows' logits; with hidden=True
                                                   the hidden states instead (a sampler graph
                                                   with the LM head inside takes those)
    enable_cuda_graphs(max_tokens, full_tokens) -> StepGraphs | None
    call(fn, *args) -> [fn(ModelRunner, *args) of each rank]   (sleep mode, weight updates)
    model, kv_cache, attention                      rank 0's
    supports_hidden                                 declared: execute(hidden=True) works
    close()

LocalExecutor runs one ModelRunner in this process; toolkit.parallel.executor.TPExecutor runs
the same ModelRunner on each of N ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from toolkit.worker.model_runner import ForwardInputs, ModelRunner


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None = None          # float32 [N, V]
    prompt_logits: torch.Tensor | None = None   # float32 [P, V]: rows batch.prompt_rows
    hidden: torch.Tensor | None = None          # [T, hidden] (execute(hidden=True))


def forward_inputs(batch: Any) -> ForwardInputs:
    return ForwardInputs(batch.layout, batch.input_ids, batch.positions, batch.graph_batch,
                         batch.blocks_to_copy)


class LocalExecutor:
    supports_hidden = True

    def __init__(self, model: Any, attention: Any, kv_cache: Any, device: torch.device,
                 copy_backend: str = "auto") -> None:
        self.runner = ModelRunner(model, attention, kv_cache, device, copy_backend)
        self.model, self.attention, self.kv_cache, self.device = model, attention, kv_cache, device

    @property
    def graphs(self) -> Any:
        return self.runner.graphs

    def enable_cuda_graphs(self, max_tokens: int, full_tokens: int | None = None) -> Any:
        return self.runner.graphs if self.runner.enable_cuda_graphs(max_tokens, full_tokens) else None

    def execute(self, batch: Any, hidden: bool = False) -> ForwardOutput:
        h = self.runner.forward(forward_inputs(batch))
        prompt_rows = (torch.tensor(batch.prompt_rows, device=h.device) if batch.prompt_rows else None)
        if hidden:
            prompt = self.model.compute_logits(h[prompt_rows]) if prompt_rows is not None else None
            return ForwardOutput(prompt_logits=prompt, hidden=h)
        logits, prompt = self.runner.logits(h, batch.logits_indices, prompt_rows)
        return ForwardOutput(logits, prompt)

    def call(self, fn: Any, *args: Any) -> list[Any]:
        """fn(ModelRunner, *args) on the one rank: [its result] (TPExecutor.call's form)."""
        return [fn(self.runner, *args)]

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalExecutor({type(self.model).__name__} on {self.device})"
