"""A server on a free loopback port, over a tiny random model that shares the embedded
SmolLM2's tokenizer and chat template (fast, and the text path is real)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_util import Server, start_server  # noqa: E402


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory) -> str:
    """A tiny random Llama with SmolLM2's vocabulary, tokenizer files and chat template."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from toolkit.models import default_model_path

    src = Path(default_model_path())
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = tmp_path_factory.mktemp("tiny_chat")
    model.save_pretrained(path)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(f, path / f.name)
    return str(path)


@pytest.fixture(scope="module")
def server(tiny_chat_dir):
    srv, engine = start_server(tiny_chat_dir)
    yield srv, engine
    srv.stop()


@pytest.fixture
def make_server():
    """start_server as a fixture; every server it started is stopped at teardown."""
    started: list[Server] = []

    def make(model_dir: str, **app_kwargs):
        srv, engine = start_server(model_dir, **app_kwargs)
        started.append(srv)
        return srv, engine

    yield make
    for srv in started:
        srv.stop()
