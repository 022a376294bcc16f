from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig


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
