from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

# the tiny model's KV block: [layers, 2, block_size, kv heads, head_dim]
BS = 4
BLOCK_SHAPE = (2, 2, BS, 2, 16)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A tiny random Llama saved as a Hugging Face folder."""
    cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=517, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = tmp_path_factory.mktemp("tiny_llama_kvt")
    model.save_pretrained(path)
    return str(path)
