"""The engine's Pooler from its model: the pooling config (given, a sentence-transformers
folder's, or the model's default) and the classifier head."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from toolkit.pooling.config import PoolerConfig, sentence_transformers_config
from toolkit.pooling.pooler import Pooler


def pooler_config_of(model: Any, folder: str | Path | None, given: PoolerConfig | None) -> PoolerConfig:
    """given, else the folder's sentence-transformers modules, else the model's default
    (`model.default_pooler_config`: BERT's CLS), else LAST + normalize (decoder embedders)."""
    if given is not None:
        return given
    if folder is not None:
        found = sentence_transformers_config(folder)
        if found is not None:
            return found
    default = getattr(model, "default_pooler_config", None)
    return default if isinstance(default, PoolerConfig) else PoolerConfig()


def token_ids_of(tokens: list[str | int], tokenizer: Any, vocab_size: int) -> list[int]:
    """Each classifier token as an id (a string through the tokenizer's vocabulary)."""
    ids = []
    for t in tokens:
        if isinstance(t, str):
            if tokenizer is None:
                raise ValueError(f"classifier_from_token {t!r} needs a tokenizer; give token ids instead")
            i = tokenizer.convert_tokens_to_ids(t)
            if i is None or i == getattr(tokenizer, "unk_token_id", object()):
                raise ValueError(f"classifier_from_token {t!r} is not one token of this tokenizer")
            t = i
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"classifier_from_token ids must be in [0, {vocab_size}), got {t!r}")
        ids.append(int(t))
    return ids


def build_pooler(model: Any, tokenizer: Any, folder: str | Path | None, given: PoolerConfig | None,
                 compute_logits: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Pooler:
    """The Pooler; its classifier is the classifier_from_token recipe (the LM head's rows of
    those tokens), else the model's own `classify(hidden [N, H]) -> logits [N, C]`, else none.
    compute_logits: hidden [N, H] -> float32 [N, V] (default model.compute_logits; a
    tensor-parallel engine's runs every rank's part of the LM head: pooling/ranks.py)."""
    cfg = pooler_config_of(model, folder, given)
    logits_of = compute_logits if compute_logits is not None else model.compute_logits
    head: Callable[[torch.Tensor], torch.Tensor] | None = None
    if cfg.classifier_from_token is not None:
        if not getattr(model.spec, "supports_generation", True):
            raise ValueError("classifier_from_token reads the LM head's logits; this model has no LM head")
        ids = torch.tensor(token_ids_of(cfg.classifier_from_token, tokenizer, model.spec.vocab_size))

        def head(x: torch.Tensor) -> torch.Tensor:
            return logits_of(x)[:, ids.to(x.device)]                   # [N, len(tokens)]
    elif callable(getattr(model, "classify", None)):
        head = model.classify
    return Pooler(cfg, head, dtype=model.spec.dtype)
