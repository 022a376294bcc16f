"""LLM.beam_search equals Hugging Face's beam search on the same weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolkit import LLM


def _hf_beams(model, prompt, width, n, **kw):
    x = torch.tensor([prompt])
    g = model.generate(x, attention_mask=torch.ones_like(x), num_beams=width, num_return_sequences=width,
                       do_sample=False, max_new_tokens=n, early_stopping=True, length_penalty=1.0,
                       pad_token_id=0, **kw)
    return [[t for t in s[len(prompt):] if t != 0] for s in g.tolist()]


def test_tiny_all_beams_equal_hf(tiny_llama_dir):
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    prompts = [[5, 6, 7, 8, 9], list(range(30, 48))]
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", block_size=4) as llm:
        outs = llm.beam_search(prompts, 3, 8, ignore_eos=True)
        assert llm.engine.scheduler.allocator.num_free_blocks() == llm.engine.num_blocks
    for p, o in zip(prompts, outs):
        assert [b.tokens[len(p):] for b in o.sequences] == _hf_beams(hf, p, 3, 8, min_new_tokens=8)


@pytest.mark.slow
def test_embedded_best_beam_equals_hf():
    from toolkit.models import apply_chat_template, default_model_path

    hf = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    with LLM(dtype="float32", device="cpu") as llm:
        tok = llm.tokenizer
        ids = tok.encode(apply_chat_template(tok, [{"role": "user", "content": "Hi!"}]),
                         add_special_tokens=False)
        out = llm.beam_search([ids], 2, 10)[0]
    assert out.sequences[0].tokens[len(ids):] == _hf_beams(hf, ids, 2, 10)[0]
