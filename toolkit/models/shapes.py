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


def qwen3_30b_a3b() -> Any:
    """Qwen3-30B-A3B: hidden 2048, 48 layers, 32 q / 4 kv heads x 128, every layer's MLP 128
    experts of intermediate 768, top-8 renormalised (3.3B active of 30.5B parameters)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
                          rope_theta=1e6, eos_token_id=151645, bos_token_id=151643)
