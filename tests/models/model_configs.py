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


def new_family_config(family: str) -> Any:
    """Tiny configs of the families beyond Llama: windows shorter than the test prompts,
    interleaved local and global layers, soft caps, fused checkpoint tensors."""
    import transformers as tf

    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=211, num_hidden_layers=4, intermediate_size=96, max_position_embeddings=256,
                 rms_norm_eps=1e-6)
    if family == "gemma2":     # local/global alternating (window 6), logit soft caps 50 / 30
        return tf.Gemma2Config(**small, sliding_window=6, query_pre_attn_scalar=24,
                               attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                               layer_types=["sliding_attention", "full_attention"] * 2)
    if family == "gemma3":     # q/k norms, local layers at their own base frequency
        return tf.Gemma3TextConfig(**small, sliding_window=5,
                                   layer_types=["sliding_attention", "sliding_attention",
                                                "full_attention", "sliding_attention"],
                                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                    "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                       "rope_theta": 10000.0}})
    if family == "phi3":       # fused qkv / gate_up, partial rotary, a window on every layer
        return tf.Phi3Config(**small, sliding_window=7, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5})
    raise ValueError(family)


NEW_FAMILIES = ["gemma2", "gemma3", "phi3"]


def build_hf_new(family: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(new_family_config(family), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    randomize(model, seed)
    return model
