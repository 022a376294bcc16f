"""Read a PEFT LoRA folder: adapter_config.json + adapter_model.safetensors (or .bin).

The result is host tensors keyed by the Hugging Face module path of each adapted linear
(`model.layers.3.self_attn.q_proj`): A [r, in] and B [out, r] with the adapter's scale
(lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora) already folded into B, in float32.
What the toolkit cannot run (DoRA, embeddings or the LM head as targets, modules_to_save,
per-module rank/alpha patterns, Conv1D's fan_in_fan_out) is a ValueError naming it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# checkpoint names a LoRA may target (Llama-family projections)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")


@dataclass
class AdapterWeights:
    """One adapter on the host: {module path: (A [r, in], B [out, r] x scale)}, float32."""
    lora_int_id: int
    lora_name: str
    rank: int                                             # the largest rank over its modules
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.modules.values())

    def __repr__(self) -> str:
        kinds = sorted({m.rsplit(".", 1)[-1] for m in self.modules})
        return (f"AdapterWeights({self.lora_name!r}, id={self.lora_int_id}, rank={self.rank}, "
                f"{len(self.modules)} modules {kinds}, {self.nbytes / 2**20:.2f} MiB)")


def read_config(path: str | Path) -> dict[str, Any]:
    """adapter_config.json of a PEFT folder, checked for what the toolkit runs."""
    folder = Path(path)
    cfg_file = folder / "adapter_config.json"
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter folder {str(folder)!r} does not exist (expected a PEFT LoRA "
                         "folder: adapter_config.json + adapter_model.safetensors)")
    if not cfg_file.is_file():
        raise ValueError(f"LoRA adapter folder {str(folder)!r} has no adapter_config.json (expected a "
                         "PEFT LoRA folder: adapter_config.json + adapter_model.safetensors)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_file} must hold a JSON object, got {type(cfg).__name__}")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{folder}: peft_type {cfg.get('peft_type')!r} is not a LoRA adapter")
    for key, what in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) layers"),
                      ("modules_to_save", "modules_to_save"), ("rank_pattern", "per-module rank_pattern"),
                      ("alpha_pattern", "per-module alpha_pattern")):
        if cfg.get(key):
            raise ValueError(f"{folder}: {what} is not supported; supported are plain LoRA adapters on "
                             f"{TARGETS}")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{folder}: bias={cfg['bias']!r} is not supported (only 'none')")
    if not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        raise ValueError(f"{folder}: adapter_config.json needs an integer r >= 1, got {cfg.get('r')!r}")
    alpha = cfg.get("lora_alpha", cfg["r"])
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"{folder}: adapter_config.json's lora_alpha must be a number, got {alpha!r}")
    return cfg


def read_adapter(path: str | Path, lora_int_id: int, lora_name: str, max_rank: int) -> AdapterWeights:
    """The adapter's weights (module doc); ValueError for a folder that is not a LoRA the
    toolkit runs, or a rank above max_rank."""
    folder = Path(path)
    cfg = read_config(folder)
    tensors = _read_tensors(folder)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"{folder}: tensor {key!r} is not a LoRA A/B weight (embedding adapters, "
                             "biases and modules_to_save are not supported)")
        module = m.group("module")
        if module.rsplit(".", 1)[-1] not in TARGETS:
            raise ValueError(f"{folder}: LoRA on {module!r} is not supported; supported targets: {TARGETS}")
        pairs.setdefault(module, {})[m.group("ab")] = t
    if not pairs:
        raise ValueError(f"{folder}: the adapter holds no LoRA weights")
    alpha, rslora = float(cfg.get("lora_alpha", cfg["r"])), bool(cfg.get("use_rslora", False))
    modules, rank = {}, 0
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{folder}: {module} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"].float(), ab["B"].float()                  # [r, in], [out, r]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r:
            raise ValueError(f"{folder}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; "
                             "expected [r, in] and [out, r]")
        if r != cfg["r"]:                                       # peft's load fails on it too
            raise ValueError(f"{folder}: {module} has rank {r} but adapter_config.json says r={cfg['r']}")
        if r > max_rank:
            raise ValueError(f"adapter {lora_name!r} ({folder}) has rank {r} on {module}, more than "
                             f"max_lora_rank={max_rank}; raise max_lora_rank (LLM(..., max_lora_rank=...))")
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        modules[module] = (a.contiguous(), (b * scale).contiguous())
        rank = max(rank, r)
    return AdapterWeights(lora_int_id, lora_name, rank, modules)


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    st, pt = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file

            return load_file(str(st))
        if pt.is_file():
            return torch.load(str(pt), map_location="cpu", weights_only=True)
    except Exception as e:          # safetensors' own error type, pickle's, a truncated file's
        raise ValueError(f"cannot read the LoRA adapter's weights in {str(folder)!r}: "
                         f"{type(e).__name__}: {e}") from e
    raise ValueError(f"LoRA adapter folder {str(folder)!r} has no adapter_model.safetensors (nor .bin)")
