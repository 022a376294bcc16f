"""make_adapter: a PEFT LoRA on a model, saved, and its merged reference (a module of its own,
not conftest.py: tests import it)."""

from __future__ import annotations

from pathlib import Path

import torch


def make_adapter(base: torch.nn.Module, folder: Path, *, r: int, targets: list[str], alpha: float,
                 rslora: bool = False, seed: int = 0, gain: float = 4.0) -> torch.nn.Module:
    """Save a PEFT LoRA of `base` in folder; returns the merged model (the reference)."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False,
                     use_rslora=rslora, lora_dropout=0.0)
    peft_model = get_peft_model(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(gain)
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload().eval()
