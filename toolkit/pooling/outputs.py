"""vLLM's output types of pooling requests. The engine returns PoolingRequestOutput (the
pooled tensor); LLM.embed / classify / score return the task's typed view of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PoolingOutput:
    data: torch.Tensor                      # float32 [D] (embed) or [C] (classify) or [1] (score)


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int] = field(default_factory=list)
    finished: bool = True
    prompt: str | None = None
    task: str = "embed"
    finish_reason: str | None = "stop"
    metrics: Any = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, o: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(o.request_id, EmbeddingOutput(o.outputs.data.tolist()), o.prompt_token_ids, o.finished)


@dataclass
class ClassificationRequestOutput:
    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, o: PoolingRequestOutput) -> ClassificationRequestOutput:
        return cls(o.request_id, ClassificationOutput(o.outputs.data.tolist()), o.prompt_token_ids, o.finished)


@dataclass
class ScoringRequestOutput:
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, o: PoolingRequestOutput) -> ScoringRequestOutput:
        return cls(o.request_id, ScoringOutput(float(o.outputs.data.reshape(-1)[-1])), o.prompt_token_ids,
                   o.finished)
