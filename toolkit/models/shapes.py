"""Configs of real model shapes, for random-weight benchmarks (`LLM(config)` loads "dummy"
weights): the geometry is what costs time, not the values."""

from __future__ import annotations

from typing import Any


def qwen3_0_6b() -> Any:
    """Qwen3-0.6B: hidden 1024, 28 layers, 16 q / 8 kv heads x 128, intermediate 3072, tied."""
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                       rope_theta=1e6, eos_token_id=151645, bos_token_id=151643)


def llama31_8b() -> Any:
    """Llama-3.1-8B: hidden 4096, 32 layers, 32 q / 8 kv heads x 128, llama3 RoPE scaling."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                       max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       eos_token_id=128009, bos_token_id=128000)
