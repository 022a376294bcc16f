"""Tiny random Hugging Face configs and checkpoints of each Llama family, for the model tests.
(A module of its own, not conftest.py: test files import these, and a `from conftest import`
would find tests/engine/conftest.py first when both folders run in one pytest session.)"""

from __future__ import annotations

from typing import Any

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
COMMON = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, vocab_size=517,
              num_hidden_layers=2, intermediate_size=160, max_position_embeddings=512, rms_norm_eps=1e-5)


def family_config(family: str) -> Any:
    """A tiny config with odd sizes per family; each also exercises one option of its own."""
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**COMMON, tie_word_embeddings=False)
    if family == "llama3":   # llama3 rope scaling (the band 16..64 positions is interpolated), biases, tied
        return tf.LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE, attention_bias=True, mlp_bias=True,
                              tie_word_embeddings=True)
    if family == "mistral":  # sliding window shorter than the sequences, head_dim != hidden / heads
        return tf.MistralConfig(**COMMON, sliding_window=9, head_dim=20, tie_word_embeddings=False)
    if family == "qwen2":    # QKV bias
        return tf.Qwen2Config(**COMMON, tie_word_embeddings=True)
    if family == "qwen3":    # per-head q/k RMSNorm, explicit head_dim
        return tf.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=False)
    raise ValueError(family)


FAMILIES = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights large enough that logits are far from zero, and norms/biases that are not 1/0,
    so a norm or bias loaded into the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        elif name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.08)


def build_hf(family: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family), dtype=torch.float32).eval()
    randomize(model, seed)
    return model
