from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A tiny random Llama saved as a Hugging Face folder (odd sizes on purpose)."""
    cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=517, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_greedy():
    """HF transformers' greedy generate, the peer every engine output is compared with."""
    return _hf_greedy


def _hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
        outs.append(g[0, len(p):].tolist())
    return outs
