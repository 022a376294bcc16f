"""build_shard: one rank's part of a model, built and filled by the model's own layers.

A tensor-parallel rank builds the same model class TP=1 builds, with its Group: the layers
(toolkit/models/layers/) hold this rank's slices and talk to the other ranks. Loading reads
only the rank's slices (safetensors slice handles, which each layer's weight_loader narrows
before reading); random weights are drawn whole per checkpoint tensor and sliced by the
same loaders, so every size draws the TP=1 model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from toolkit.parallel.group import Group
from toolkit.parallel.sharding import check_tensor_parallel


def build_shard(source: Any, group: Group, *, dtype: torch.dtype, device: torch.device,
                load_format: str = "auto", quantization: str | None = None,
                linear_method: Any = None) -> Any:
    """This rank's model from a Hugging Face folder (its slices only) or a config (random);
    linear_method: layer name -> LinearMethod (multi-LoRA's, wrapping each adaptable layer)."""
    from toolkit.models.loader import load_model

    config = source
    if isinstance(source, (str, Path)):
        from toolkit.models.loader import load_config

        config = load_config(Path(source))
    check_tensor_parallel(config, group.size)
    extra = {"linear_method": linear_method} if linear_method is not None else {}
    model = load_model(source, dtype=dtype, device=device, load_format=load_format, group=group,
                       quantization=quantization, **extra)
    if not model.spec.supports_tensor_parallel:
        raise ValueError(f"{type(model).__name__} does not support tensor parallelism")
    if model.device.type == "cuda":       # the full random tensors' memory back before the KV sizing
        torch.cuda.empty_cache()
    return model
