"""The device memory a step's activations need, measured before the KV cache takes the rest.

The KV cache is sized from the memory free after the weights load (gpu_memory_utilization of
it). What a step allocates on top (the MLP's or the experts' intermediates at
max_num_batched_tokens, the logits of max_num_seqs rows) must fit beside it; on a card where
the weights leave little free (a 30B MoE on 80 GB) a fixed fraction does not. So, as vLLM's
profile run does, one forward of the largest step runs first with an attention backend that
keeps no KV (`NoKVAttention`), and the budget leaves twice its peak free: once for an eager
step's activations, once for the CUDA graphs' private pools, which hold as much for the
largest captured step.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

MARGIN_BYTES = 256 * 2**20          # the allocator's rounding, cuBLAS workspaces, small buffers


class NoKVAttention:
    """An attention backend that reads and writes no cache: out = zeros like q (the memory a
    layer's attention output takes, nothing more). For profiling only."""

    supports_fused_kv_write = False

    def plan(self, layout: Any) -> None:
        pass

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pass

    def run(self, layer: int, q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.zeros_like(q) if out is None else out.zero_()        # [T, H, D]


@torch.inference_mode()
def profile_forward(model: Any, num_tokens: int, num_rows: int) -> torch.Tensor:
    """One forward of `num_tokens` dummy tokens (positions within the model's), then the
    logits of `num_rows` of them when the model has an LM head: hidden [T, H]."""
    device = next(model.parameters()).device
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)                 # [T]
    positions = torch.arange(num_tokens, device=device) % model.spec.max_model_len  # [T]
    hidden = model.forward(ids, positions, NoKVAttention())
    if model.spec.supports_generation and num_rows > 0:
        model.compute_logits(hidden[:num_rows])                                     # [R, V] float32
    return hidden


def activation_peak_bytes(model: Any, num_tokens: int, num_rows: int, device: torch.device) -> int:
    """Bytes the largest step allocates above the weights (0 off CUDA, where nothing is sized
    from free memory). Every tensor-parallel rank calls it at once (its all-reduces pair up)."""
    if device.type != "cuda" or num_tokens <= 0:
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    profile_forward(model, num_tokens, num_rows)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    log.info("a %d-token step's activations peak at %.2f GiB", num_tokens, peak / 2**30)
    return peak


def kv_budget_bytes(free: int, gpu_memory_utilization: float, activation_peak: int) -> int:
    """The KV cache's bytes: gpu_memory_utilization of the free memory, less where that would
    not leave twice the activations' peak (eager step + graph pools) and a margin."""
    budget = int(free * gpu_memory_utilization)
    if activation_peak > 0:
        keep = 2 * activation_peak + MARGIN_BYTES
        if free - budget < keep:
            log.info("KV cache budget %.2f -> %.2f GiB: %.2f GiB kept for activations",
                     budget / 2**30, max(0, free - keep) / 2**30, keep / 2**30)
            budget = max(0, free - keep)
    return budget
