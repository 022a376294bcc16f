"""PoolingParams: what one pooling request asks for (vLLM's name and fields)."""

from __future__ import annotations

from dataclasses import dataclass

POOLING_TASKS = ("embed", "classify", "score")


@dataclass
class PoolingParams:
    """task "embed": the pooled hidden state (its first `dimensions` values, Matryoshka
    style; L2-normalised when `normalize`, None = the model's default); "classify": the
    classifier head's probabilities (softmax; `use_activation=False` gives the raw logits);
    "score": one relevance number (the probability of the head's last class, e.g. "yes").
    None: the engine's default task ("embed").
    truncate_prompt_tokens: k keeps the prompt's last k tokens (left truncation, vLLM's
    semantics); -1 the last max_model_len; None (default) refuses an over-long prompt."""

    task: str | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {POOLING_TASKS} or None, got {self.task!r}")
        for name in ("normalize", "use_activation"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise TypeError(f"{name} must be True, False or None, got {v!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"dimensions must be None or an integer >= 1, got {d!r}")
        if d is not None and self.task not in (None, "embed"):
            raise ValueError(f"dimensions applies to task 'embed' only, got task={self.task!r}")
        k = self.truncate_prompt_tokens
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise TypeError(f"truncate_prompt_tokens must be an int or None, got {type(k).__name__}")
        if k is not None and k < 1 and k != -1:
            raise ValueError(f"truncate_prompt_tokens must be None, -1 (max_model_len) or >= 1, got {k}")

    def __repr__(self) -> str:
        given = [f"{k}={getattr(self, k)!r}" for k in ("task", "normalize", "dimensions", "use_activation",
                                                        "truncate_prompt_tokens")
                 if getattr(self, k) is not None]
        return f"PoolingParams({', '.join(given)})"
