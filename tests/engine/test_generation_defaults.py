"""--generation-config / EngineConfig.generation_config: a model folder's sampling defaults
(generation_config.json) fill what a request leaves unset, as vLLM's "auto" does; "vllm"
ignores them; a request's own value wins; bad files are refused with the file named."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from toolkit import LLM, SamplingParams
from toolkit.models.generation_defaults import generation_defaults
from toolkit.serving import protocol as P

CARD = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
        "top_k": 20, "max_new_tokens": 3, "num_beams": 1}


def _folder(tmp_path, src: str | None = None, card: dict = CARD):
    dst = tmp_path / "model"
    if src is not None:
        shutil.copytree(src, dst)
    else:
        dst.mkdir()
    (dst / "generation_config.json").write_text(json.dumps(card))
    return dst


def test_auto_takes_the_cards_sampling_fields_and_vllm_none(tmp_path):
    folder = _folder(tmp_path)
    assert generation_defaults("auto", folder) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                   "max_tokens": 3}
    assert generation_defaults("vllm", folder) == {}
    assert generation_defaults("auto", None) == {} == generation_defaults("auto", tmp_path)  # no card
    assert generation_defaults(str(folder), None)["top_k"] == 20    # another folder's card


def test_a_bad_card_or_source_is_refused_with_what_is_valid(tmp_path):
    bad = _folder(tmp_path, card={"top_p": 1.5})
    with pytest.raises(ValueError, match=r"generation_config.json sets a sampling default .*top_p"):
        generation_defaults("auto", bad)
    with pytest.raises(ValueError, match=r"no generation_config.json in that folder; valid values"):
        generation_defaults(str(tmp_path / "nowhere"), None)
    with pytest.raises(TypeError, match="generation_config must be a string"):
        generation_defaults(None, bad)   # type: ignore[arg-type]


def test_llm_uses_the_card_when_given_no_params(tmp_path, tiny_llama_dir):
    folder = _folder(tmp_path, tiny_llama_dir, {**CARD, "temperature": 0.0})
    with LLM(str(folder), dtype="float32", device="cpu", num_blocks=32, block_size=8) as llm:
        sp = llm.get_default_sampling_params()
        assert (sp.max_tokens, sp.temperature, sp.top_k) == (3, 0.0, 20)
        out = llm.generate([[5, 6, 7]], use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == 3 or out.finish_reason == "stop"
        own = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
        assert len(own.token_ids) == 5                  # a request's own params win
    with LLM(str(folder), dtype="float32", device="cpu", num_blocks=32, block_size=8,
             generation_config="vllm") as llm:
        assert llm.get_default_sampling_params().max_tokens == SamplingParams().max_tokens


def test_the_server_fills_only_unset_fields():
    d = {"temperature": 0.3, "top_k": 5, "top_p": 0.8}
    chat = P.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                   temperature=0.9)
    sp = chat.sampling_params(100, 4, defaults=d)
    assert (sp.temperature, sp.top_k, sp.top_p) == (0.9, 5, 0.8)
    cmpl = P.CompletionRequest(model="m", prompt="hi", top_k=7)
    sp = cmpl.sampling_params(100, 2, defaults=d)
    assert (sp.temperature, sp.top_k, sp.top_p, sp.max_tokens) == (0.3, 7, 0.8, 16)
    assert P.CompletionRequest(model="m", prompt="hi").sampling_params(100, 2).temperature == 1.0


def test_serve_flags(tmp_path, caplog):
    from toolkit.serve import engine_options, parse_args, sampling_defaults

    folder = _folder(tmp_path)
    args = parse_args([str(folder), "--generation-config", "vllm", "--disable-log-requests"])
    assert sampling_defaults(args) == {} and engine_options(args)["generation_config"] == "vllm"
    assert sampling_defaults(parse_args([str(folder)]))["temperature"] == 0.6
    with pytest.raises(SystemExit, match="--generation-config"):
        sampling_defaults(parse_args([str(folder), "--generation-config", str(tmp_path / "x")]))


def test_enable_log_requests_logs_each_prepared_request(caplog):
    from toolkit.serving.handlers import OpenAIHandlers

    class _Engine:                          # what OpenAIHandlers reads of an AsyncEngine
        tokenizer, max_model_len, vocab_size = None, 64, 100

    h = OpenAIHandlers(_Engine(), "m", log_requests=True, sampling_defaults={"top_k": 3})
    with caplog.at_level(logging.INFO, logger="toolkit.serving.handlers"):
        prep = h.prepare_completion(P.CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4))
    assert prep.params[0].top_k == 3
    assert any(prep.request_id in r.message and "[3] prompt tokens" in r.message
               and "'top_k': 3" in r.message for r in caplog.records), caplog.text
    quiet = OpenAIHandlers(_Engine(), "m")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="toolkit.serving.handlers"):
        quiet.prepare_completion(P.CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4))
    assert not caplog.records
