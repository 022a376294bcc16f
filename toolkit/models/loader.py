"""load_model / load_tokenizer: a model from a local Hugging Face folder or a config.

The class is picked from `config.architectures` through the registry's "model" table
(toolkit/models/registry.py: the toolkit's files, `register_model`, and the `toolkit.models`
entry-point group).
Parameters are allocated once on the target device in the target dtype; real weights are
then copied in tensor by tensor from the (memory-mapped) shards, random ones initialised
in place, so no second full copy of the weights ever exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from toolkit.models.registry import resolve, supported_architectures
from toolkit.models.weights import iterate_weights, resolve_format

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


MODEL_IMPLS = ("auto", "native", "transformers")


def model_class(config: Any, model_impl: str = "auto") -> type:
    """The class that runs the config: model_impl "native": the registered class for its
    architectures (ValueError listing the supported ones); "transformers": the Transformers
    backend; "auto": native where registered, else the Transformers backend."""
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl must be one of {MODEL_IMPLS}, got {model_impl!r}")
    if model_impl == "transformers":
        from toolkit.models.transformers_backend import TransformersForCausalLM

        return TransformersForCausalLM
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:  # a config built in code: the causal-LM class transformers maps its model_type to
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
        archs = [arch] if isinstance(arch, str) else []
    cls = resolve(archs)
    if cls is not None:
        return cls
    unsupported = (
        f"unsupported architecture {archs or getattr(config, 'model_type', None)!r}; "
        f"supported config.architectures: {supported_architectures()} (add one with "
        f"toolkit.models.register_model or a 'toolkit.models' entry point)"
    )
    if model_impl == "native":
        raise ValueError(unsupported)
    from toolkit.models.transformers_backend import TransformersForCausalLM, transformers_class

    try:
        transformers_class(config)
    except ValueError as e:
        raise ValueError(f"{unsupported}; nor can the Transformers backend run it: {e}") from None
    return TransformersForCausalLM


def load_config(folder: str | os.PathLike) -> Any:
    path = Path(folder)
    if not path.is_dir():
        hub = str(folder).count("/") == 1 and not str(folder).startswith((".", "/", "~"))
        hint = (f"; {str(folder)!r} looks like a Hugging Face hub id: the toolkit reads local "
                f"folders only, so download it first (`huggingface-cli download {folder} "
                f"--local-dir <folder>`) and pass the folder") if hub else ""
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist (expected a local Hugging Face "
            f"folder with config.json and weights){hint}"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; a Hugging Face model folder needs one")
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def load_model(
    source: Any,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    group: Any = None,
    kernels: str = "auto",
    model_impl: str = "auto",
    linear_method: Any = None,
    quantization: str | None = None,
) -> torch.nn.Module:
    """A model from a local HF folder (safetensors, or .bin with load_format="pt") or random weights.

    `source` is a folder path or a transformers PretrainedConfig (random weights, as with
    load_format="dummy"). Random weights are N(0, 0.02) with norms at their neutral value, so
    activations stay finite in bf16 through many layers. group: this rank's tensor-parallel
    Group (None: one process); its layers read only their slices of each tensor. kernels:
    "auto" | "triton" | "cpu" | "torch" (toolkit/models/ops.py). model_impl: "auto" | "native"
    | "transformers" (model_class). linear_method: layer name -> its LinearMethod (None: dense),
    for a native model (a quantization config or LoRA plugs in here). quantization: None (the
    checkpoint's quantization_config, if any, is read), "fp8" (an unquantized checkpoint is
    quantized at load time), or the checkpoint's method (toolkit/models/quantization/); a
    linear_method given too is asked first, the quantization scheme where it answers None; a
    linear_method with an `around(base_fn)` attribute (a wrapper: LoRA) is rebuilt around the
    scheme instead, so it wraps each layer's quantized method.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    folder = None
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        config = load_config(folder)
    elif hasattr(source, "to_dict") and hasattr(source, "model_type"):
        config, load_format = source, "dummy"
    else:
        raise ValueError(
            f"source must be a local model folder or a transformers config, got {type(source).__name__}"
        )
    cls = model_class(config, model_impl)
    fmt = "dummy" if load_format == "dummy" else resolve_format(folder, load_format)
    linear_method, scheme = _with_quantization(config, cls, quantization, kernels, linear_method)
    extra = {"linear_method": linear_method} if linear_method is not None else {}
    model = cls(config, dtype=dtype, device=device, group=group, kernels=kernels,
                eos_token_ids=_eos_token_ids(folder, config), **extra)
    if fmt == "dummy":
        model.init_random()
    else:
        sliced = group is not None and group.size > 1     # read only this rank's slices
        loaded = model.load_weights(iterate_weights(folder, fmt, lazy=sliced))
        missing = [
            f"{name}" + (f" (part {i} of {n})" if n > 1 else "")
            for name, n in model.expected_weights().items()
            for i in range(n)
            if (name, i) not in loaded
        ]
        if missing:
            raise ValueError(
                f"checkpoint in {folder} lacks {len(missing)} tensor(s) the model needs: "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}"
            )
    if scheme is not None:
        model.quantization_scheme = scheme       # what describe / repr show
        from toolkit.models.quantization.fusion import fuse_activation_quant

        fuse_activation_quant(model)             # norms / SiLU hand W8A8 layers codes (Triton path)
    return model.eval()


def _with_quantization(config: Any, cls: type, quantization: str | None, kernels: str,
                       linear_method: Any) -> tuple[Any, Any]:
    """(the per-module method fn, the QuantizationScheme or None): the checkpoint's or the asked
    quantization, behind a caller's linear_method when both are given."""
    from toolkit.models.quantization import quantization_method_fn

    scheme = quantization_method_fn(config, quantization,
                                    kernels={"triton": "triton", "torch": "reference"}.get(kernels, "auto"))
    if scheme is None:
        return linear_method, None
    if cls.__name__ == "TransformersForCausalLM":
        raise ValueError(f"quantized weights ({scheme.method}) run on the toolkit's native model files; "
                         "model_impl='transformers' cannot load them (use model_impl='native' or 'auto' "
                         "with a supported architecture)")
    if linear_method is None:
        return scheme, scheme
    around = getattr(linear_method, "around", None)
    if around is not None:          # a wrapper (LoRA): it wraps each layer's quantized method
        return around(scheme), scheme
    return (lambda name: linear_method(name) or scheme(name)), scheme


def _eos_token_ids(folder: Path | None, config: Any) -> list[int]:
    """EOS ids from generation_config.json when the folder has one, else from the config."""
    eos = None
    if folder is not None and (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(folder)).eos_token_id
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The transformers tokenizer of a local model folder (AutoTokenizer)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {str(folder)!r} does not exist")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))
