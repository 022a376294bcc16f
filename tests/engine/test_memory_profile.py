"""The profile step that sizes the KV cache's room for activations (worker/memory_profile.py):
one forward without a KV cache runs on every kind of model, and the budget leaves twice the
peak free. (Memory itself is measured on CUDA only; the CPU runs the same forward.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from toolkit import LLM
from toolkit.worker.memory_profile import MARGIN_BYTES, activation_peak_bytes, kv_budget_bytes, profile_forward

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))


def _configs():
    import transformers as tf
    from model_configs import family_config
    from moe_configs import moe_config

    return {"llama": family_config("llama"), "mistral": family_config("mistral"),
            "qwen3_moe": moe_config("qwen3_moe"), "dots1": moe_config("dots1"), "bert": tf.BertConfig(vocab_size=211, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=80, max_position_embeddings=64)}


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3_moe", "dots1", "bert"])
def test_profile_forward_runs_without_a_kv_cache(name):
    config = _configs()[name]
    if name == "bert":
        config.architectures = ["BertModel"]
    with LLM(config, device="cpu", dtype="float32", num_blocks=8, block_size=4) as llm:
        model = llm.engine.model
        n = 2 * model.spec.max_model_len + 3          # past the positions: they wrap
        hidden = profile_forward(model, n, 5)
        assert hidden.shape == (n, model.spec.hidden_size) and torch.isfinite(hidden).all()
        assert activation_peak_bytes(model, n, 5, torch.device("cpu")) == 0   # nothing sized from free memory
        assert llm.engine.allocator.num_free_blocks() == 8


def test_profile_forward_with_lora_enabled(tiny_llama_dir):
    with LLM(tiny_llama_dir, device="cpu", dtype="float32", num_blocks=8, block_size=4,
             enable_lora=True, max_loras=2, max_lora_rank=8) as llm:
        assert profile_forward(llm.engine.model, 64, 4).shape[0] == 64


def test_kv_budget_leaves_twice_the_peak():
    gib = 2**30
    assert kv_budget_bytes(80 * gib, 0.9, 0) == int(72 * gib)               # no profile: the fraction
    assert kv_budget_bytes(80 * gib, 0.9, 1 * gib) == int(72 * gib)         # 8 GiB left is room enough
    assert kv_budget_bytes(19 * gib, 0.85, 2 * gib) == 15 * gib - MARGIN_BYTES   # a big MoE on 80 GB
    assert kv_budget_bytes(gib, 0.9, gib) == 0                              # nothing fits: 0, not < 0


def _profile_rank(runner, num_tokens: int, num_rows: int) -> tuple[list[float], bool]:
    """On each rank (executor.call): the profile forward's first hidden row and whether it is finite."""
    hidden = profile_forward(runner.model, num_tokens, num_rows)
    return hidden[0, :4].tolist(), bool(torch.isfinite(hidden).all())


def test_profile_forward_under_tensor_parallelism_runs_on_every_rank():
    """kv_blocks_fit profiles on every rank at once: the sharded forward's all-reduces pair up
    (gloo here), and every rank ends with the same (all-reduced) hidden states."""
    from model_configs import family_config

    with LLM(family_config("llama"), device="cpu", dtype="float32", num_blocks=8, block_size=4,
             tensor_parallel_size=2) as llm:
        ranks = llm.engine.runner.executor.call(_profile_rank, 37, 3)
    assert len(ranks) == 2 and all(ok for _, ok in ranks)
    torch.testing.assert_close(torch.tensor(ranks[0][0]), torch.tensor(ranks[1][0]))
