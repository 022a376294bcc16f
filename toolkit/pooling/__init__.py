"""Pooling: embeddings, classification and scores from a prompt's hidden states.

    PoolingParams      per request (vLLM's name): task, normalize, dimensions, use_activation
    PoolerConfig       per engine: pooling type (LAST / MEAN / CLS), default normalisation,
                       the classifier head (the yes/no-token recipe of Qwen3-Reranker)
    Pooler             hidden [T, H] of finished prompts (a ragged batch) -> one result each;
                       reference.py holds its twin
    outputs            vLLM's output types (EmbeddingRequestOutput, ...)

A pooling request is prefill-only: it finishes after its prompt's forward (its chunks'
hidden states are kept by the worker until the last one; worker side: accumulate.py).
"""

from toolkit.pooling.config import PoolerConfig
from toolkit.pooling.outputs import (
                                     ClassificationOutput,
                                     ClassificationRequestOutput,
                                     EmbeddingOutput,
                                     EmbeddingRequestOutput,
                                     PoolingOutput,
                                     PoolingRequestOutput,
                                     ScoringOutput,
                                     ScoringRequestOutput,
)
from toolkit.pooling.params import POOLING_TASKS, PoolingParams

__all__ = [
                                     "POOLING_TASKS",
                                     "ClassificationOutput",
                                     "ClassificationRequestOutput",
                                     "EmbeddingOutput",
                                     "EmbeddingRequestOutput",
                                     "PoolerConfig",
                                     "PoolingOutput",
                                     "PoolingParams",
                                     "PoolingRequestOutput",
                                     "ScoringOutput",
                                     "ScoringRequestOutput",
]
