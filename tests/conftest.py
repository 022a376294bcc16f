"""Test-session setup: Triton's interpreter on machines without CUDA, hypothesis profiles,
and the `gpu` marker (skipped without a CUDA device)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is created (i.e. before toolkit kernels import).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ci: no shrink phase. A stateful machine's failure (the scheduler storms) took minutes of
# shrinking before it was reported; without shrinking it is reported as found, in seconds,
# with the blob that reproduces it: run that test with HYPOTHESIS_PROFILE=dev to shrink it
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A tiny random Llama saved as a Hugging Face folder (odd sizes on purpose); the engine's
    and the KV connectors' tests share it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=517, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return str(path)
