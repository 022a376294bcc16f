"""PoolerConfig: how an engine pools (vLLM's PoolerConfig), and reading it from a
sentence-transformers folder (modules.json, 1_Pooling/config.json, a Normalize module)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOLING_TYPES = ("LAST", "MEAN", "CLS")


@dataclass
class PoolerConfig:
    """pooling_type: LAST (decoders: the Qwen3-Embedding recipe), MEAN (over each prompt's
    tokens) or CLS (the first token). normalize: the default of PoolingParams.normalize.
    classifier_from_token: the head of "classify" / "score" as the logits of these tokens
    at the pooled position (Qwen3-Reranker as vLLM serves it: ["no", "yes"]; the score is
    softmax over them, the last one's probability); token strings or ids. None: the model's
    own classifier, if it has one."""

    pooling_type: str = "LAST"
    normalize: bool = True
    classifier_from_token: list[str | int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pooling_type, str):
            self.pooling_type = self.pooling_type.upper()
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}")
        if not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be True or False, got {self.normalize!r}")
        c = self.classifier_from_token
        if c is not None:
            if isinstance(c, (str, bytes)) or not isinstance(c, (list, tuple)) or len(c) < 2:
                raise ValueError(f"classifier_from_token must be a list of at least 2 tokens "
                                 f"(e.g. ['no', 'yes']), got {c!r}")
            self.classifier_from_token = list(c)

    @classmethod
    def coerce(cls, value: Any) -> PoolerConfig | None:
        if value is None or isinstance(value, PoolerConfig):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"pooler_config must be a PoolerConfig, a dict or None, got {type(value).__name__}")


def sentence_transformers_config(folder: str | Path) -> PoolerConfig | None:
    """The pooling a sentence-transformers folder declares (modules.json: a Pooling module's
    config, a Normalize module), or None when the folder is not one."""
    folder = Path(folder)
    modules = folder / "modules.json"
    if not modules.is_file():
        return None
    mods = json.loads(modules.read_text())
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m for m in mods}
    unknown = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if unknown:                         # e.g. a Dense projection: vectors of another size
        raise ValueError(f"{folder}: sentence-transformers modules {unknown} are not supported (a Dense "
                         "layer changes the vector); supported: Transformer, Pooling, Normalize")
    pooling_type = "CLS"
    if "Pooling" in kinds:
        cfg = json.loads((folder / kinds["Pooling"].get("path", "1_Pooling") / "config.json").read_text())
        on = [k for k in ("cls_token", "mean_tokens", "lasttoken") if cfg.get(f"pooling_mode_{k}")]
        others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v
                  and k[len("pooling_mode_"):] not in ("cls_token", "mean_tokens", "lasttoken")]
        if len(on) != 1 or others:
            raise ValueError(f"{folder}: the sentence-transformers pooling {cfg} is not supported; "
                             "supported: exactly one of cls_token, mean_tokens, lasttoken")
        pooling_type = {"cls_token": "CLS", "mean_tokens": "MEAN", "lasttoken": "LAST"}[on[0]]
    return PoolerConfig(pooling_type=pooling_type, normalize="Normalize" in kinds)


def max_seq_length(folder: str | Path) -> int | None:
    """sentence_bert_config.json's max_seq_length (the length the model was trained to embed)."""
    path = Path(folder) / "sentence_bert_config.json"
    if not path.is_file():
        return None
    n = json.loads(path.read_text()).get("max_seq_length")
    return int(n) if n else None
