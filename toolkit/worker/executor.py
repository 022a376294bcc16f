"""Executor: runs a prepared step's forward wherever the model lives.

    execute(batch, hidden=False, logits=True) -> ForwardOutput
                                                   logits [N, V] of the sampling rows (logits=False:
                                                   None, no LM head run: a sampler graph with the
                                                   LM head inside) and prompt-logprob rows' logits;
                                                   hidden=True: the hidden states [T, H] too (rank
                                                   0's, whole on every rank: the pooler's input)
    enable_cuda_graphs(max_tokens, full_tokens) -> StepGraphs | None
    call(fn, *args) -> [fn(ModelRunner, *args) of each rank]   (sleep mode, weight updates)
    model, kv_cache, attention                      rank 0's
    supports_hidden                                 declared: execute(hidden=True) works
    local_lm_head                                   declared: model.compute_logits runs in this
                                                   process alone (False: the LM head is split over
                                                   ranks, a collective only execute() runs)
    single_process                                  declared: the whole forward runs in this process
                                                   (the warm-up's parallel compile collects its
                                                   launches; a TP group's ranks compile in turn)
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
    local_lm_head = True
    single_process = True

    def __init__(self, model: Any, attention: Any, kv_cache: Any, device: torch.device,
                 copy_backend: str = "auto") -> None:
        self.runner = ModelRunner(model, attention, kv_cache, device, copy_backend)
        self.model, self.attention, self.kv_cache, self.device = model, attention, kv_cache, device

    @property
    def graphs(self) -> Any:
        return self.runner.graphs

    def enable_cuda_graphs(self, max_tokens: int, full_tokens: int | None = None) -> Any:
        return self.runner.graphs if self.runner.enable_cuda_graphs(max_tokens, full_tokens) else None

    def execute(self, batch: Any, hidden: bool = False, logits: bool = True) -> ForwardOutput:
        prompt_rows = (torch.tensor(batch.prompt_rows, device=self.device) if batch.prompt_rows else None)
        x, prompt, h = self.runner.step(forward_inputs(batch), batch.logits_indices if logits else None,
                                        prompt_rows)
        return ForwardOutput(x, prompt, h if hidden else None)

    def call(self, fn: Any, *args: Any) -> list[Any]:
        """fn(ModelRunner, *args) on the one rank: [its result] (TPExecutor.call's form)."""
        return [fn(self.runner, *args)]

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalExecutor({type(self.model).__name__} on {self.device})"
