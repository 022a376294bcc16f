"""A tiny random Llama saved as a folder, and PEFT adapters made on it (random non-zero A and B:
init_lora_weights=False, scaled so every adapter changes the greedy output)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora_adapters import make_adapter


@pytest.fixture(scope="session")
def lora_base(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=517, max_position_embeddings=512, rms_norm_eps=1e-5,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():                 # logits far from ties (as tests/models/model_configs.py)
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g) + 0.5 if "norm" in name else torch.randn(p.shape, generator=g) * 0.08)
    folder = tmp_path_factory.mktemp("lora_base")
    model.save_pretrained(folder)
    return model, folder


ADAPTERS = {   # name: (id, rank, targets, alpha, rslora)
    "qv8": (1, 8, ["q_proj", "v_proj"], 16.0, False),
    "all4": (2, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 8.0, True),
    "mlp16": (3, 16, ["o_proj", "gate_proj", "up_proj", "down_proj"], 8.0, False),
}


@pytest.fixture(scope="session")
def adapters(lora_base, tmp_path_factory) -> dict[str, tuple[int, Path, torch.nn.Module]]:
    base, _ = lora_base
    out = {}
    for i, (name, (lid, r, targets, alpha, rslora)) in enumerate(ADAPTERS.items()):
        folder = tmp_path_factory.mktemp(f"lora_{name}")
        merged = make_adapter(base, folder, r=r, targets=targets, alpha=alpha, rslora=rslora, seed=i + 1)
        out[name] = (lid, folder, merged)
    return out
