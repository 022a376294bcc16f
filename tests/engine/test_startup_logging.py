"""Issue 54 item 10: a plain script sees what LLM(...) does at start-up (the model loaded, the
KV cache's size) without configuring logging, as with vLLM; a configured program keeps its
own handlers, and TOOLKIT_CONFIGURE_LOGGING=0 / VLLM_CONFIGURE_LOGGING=0 turn it off."""

from __future__ import annotations

import contextlib
import logging

import pytest
from transformers import LlamaConfig

from toolkit import LLM


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=128, max_position_embeddings=64)


@pytest.fixture
def plain_script(monkeypatch):
    """Logging as in a script that never configured it. pytest puts its handlers on the root
    for each test phase, so they are taken off (and put back) by `unconfigured()` in the test."""
    toolkit_logger = logging.getLogger("toolkit")
    monkeypatch.setattr(toolkit_logger, "handlers", [])
    monkeypatch.setattr(toolkit_logger, "level", logging.NOTSET)
    for var in ("TOOLKIT_CONFIGURE_LOGGING", "VLLM_CONFIGURE_LOGGING", "TOOLKIT_LOGGING_LEVEL"):
        monkeypatch.delenv(var, raising=False)
    return toolkit_logger


@contextlib.contextmanager
def unconfigured():
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        yield root
    finally:
        root.handlers[:] = saved


def test_a_plain_script_sees_the_start_up(plain_script, capsys):
    import toolkit  # noqa: F401 - importing adds nothing

    assert plain_script.handlers == []
    with unconfigured():
        LLM(config(), device="cpu", num_blocks=8).close()
        LLM(config(), device="cpu", num_blocks=8).close()   # the handler is added once
    err = capsys.readouterr().err
    assert "INFO" in err and "loaded in" in err and "KVCache" in err, err
    assert len(plain_script.handlers) == 1 and err.count("loaded in") == 2


@pytest.mark.parametrize("var, value", [("TOOLKIT_CONFIGURE_LOGGING", "0"), ("VLLM_CONFIGURE_LOGGING", "0"),
                                        ("TOOLKIT_LOGGING_LEVEL", "WARNING")])
def test_the_environment_silences_it(plain_script, capsys, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with unconfigured():
        LLM(config(), device="cpu", num_blocks=8).close()
    assert "loaded in" not in capsys.readouterr().err


def test_a_configured_program_keeps_its_own(plain_script):
    with unconfigured() as root:
        mine = logging.StreamHandler()
        root.addHandler(mine)
        LLM(config(), device="cpu", num_blocks=8).close()
        assert plain_script.handlers == [] and root.handlers == [mine]


def test_a_bad_level_says_what_is_valid(plain_script, monkeypatch):
    monkeypatch.setenv("TOOLKIT_LOGGING_LEVEL", "LOUD")
    from toolkit.log_setup import configure_logging

    with unconfigured(), pytest.raises(ValueError, match="INFO"):
        configure_logging()
