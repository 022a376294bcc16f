"""Checkpoint names -> a transformers model's state-dict names, as transformers' own loader
renames them (transformers 5's conversion mapping: e.g. GPT-NeoX's `embed_out.` is the
model's `lm_head.`; the legacy `gamma`/`beta` norms; a base-model prefix added or dropped).

Only renamings are applied. A tensor that transformers would convert (merge per-expert
tensors into fused MoE weights, split a fused qkv) is refused by name: copying it as it is
would load the wrong values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def checkpoint_renamer(hf: torch.nn.Module, state: dict[str, Any]) -> Callable[[str], str]:
    """A function checkpoint name -> state-dict name for this model."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(hf)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    prefix = getattr(hf, "base_model_prefix", None) or None

    def rename(name: str) -> str:
        if name in state:
            return name
        renamed, _ = rename_source_key(name, renamings, [], prefix, state)
        if renamed not in state:
            for conv in converters:
                _, pattern = conv.rename_source_key(renamed)
                if pattern is not None:
                    raise ValueError(
                        f"checkpoint tensor {name!r} needs transformers' {type(conv).__name__} "
                        f"({pattern!r} -> {conv.target_patterns}), which the Transformers backend's "
                        "load_weights does not apply; only renamed tensors load")
        return renamed

    return rename
