"""toolkit: composable parts for LLM inference (paged KV cache, continuous batching,
Triton PagedAttention, speculative and grammar-constrained sampling).

The short public surface is `LLM`, `SamplingParams` and `EngineConfig`; everything else
lives in its package (blocks, schedulers, samplers, attention, kernels, models, engine).
Importing the toolkit imports no kernel or model code.
"""

from __future__ import annotations

from typing import Any

from toolkit.config import EngineConfig
from toolkit.types import BeamSearchParams, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "EngineConfig", "RequestOutput",
           "GuidedDecodingParams", "StructuredOutputsParams", "LoRARequest", "PoolingParams", "PoolerConfig"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from toolkit.entrypoints.llm import LLM

        return LLM
    if name == "LoRARequest":
        from toolkit.lora.request import LoRARequest

        return LoRARequest
    if name in ("GuidedDecodingParams", "StructuredOutputsParams"):   # vLLM's names
        from toolkit.samplers.grammar import guided

        return getattr(guided, name)
    if name in ("PoolingParams", "PoolerConfig"):
        from toolkit import pooling

        return getattr(pooling, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
