"""Issue 54 item 10: a vLLM user's habits work here (names, options, flags, metric names),
and the messages a newcomer meets say what to do."""

from __future__ import annotations

import pytest

from toolkit import LLM, SamplingParams


def test_an_unknown_sampling_keyword_names_the_valid_ones():
    with pytest.raises(TypeError, match=r"'max_token': did you mean 'max_tokens'\?.*valid keywords"):
        SamplingParams(max_token=3)


def test_vllm_llm_options_and_accessors(tiny_llama_dir):
    with pytest.raises(ValueError, match=r"'max_num_seq': did you mean 'max_num_seqs'\?"):
        LLM(tiny_llama_dir, device="cpu", max_num_seq=4)
    with LLM(tiny_llama_dir, dtype="float32", device="cpu", num_blocks=16, block_size=4,
             enforce_eager=True, seed=3) as llm:
        assert llm.config.cuda_graphs is False and llm.config.seed == 3
        assert llm.get_tokenizer() is llm.tokenizer and llm.llm_engine is llm.engine
        with pytest.raises(ValueError, match=r"must be in \[0, 517\) \(the model's vocabulary\); 1 are not, "
                                             r"e\.g\. \[600\]"):
            llm.llm_engine.add_request([5, 600, 6], SamplingParams(max_tokens=1))
    from toolkit.entrypoints.llm import _vllm_options

    assert _vllm_options({"swap_space": 4, "enforce_eager": False}) == {"cpu_cache_gb": 4}


def test_guided_decoding_params_is_importable_as_in_vllm():
    from toolkit import GuidedDecodingParams, StructuredOutputsParams

    p = SamplingParams(guided_decoding=GuidedDecodingParams(choice=["yes", "no"]))
    assert p.structured is not None and p.guided_decoding is None
    assert StructuredOutputsParams is GuidedDecodingParams


def test_serve_takes_vllms_flags(tmp_path):
    pytest.importorskip("uvicorn")
    from toolkit.serve import engine_options, parse_args, read_chat_template

    args = parse_args(["m", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "2", "--seed", "7",
                       "--no-enable-prefix-caching", "--enforce-eager", "--chat-template", "{{ x }}"])
    opts = engine_options(args)
    assert opts["gpu_memory_utilization"] == 0.5 and opts["tensor_parallel_size"] == 2 and opts["seed"] == 7
    assert opts["enable_prefix_caching"] is False and opts["cuda_graphs"] is False
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert read_chat_template(str(f)).startswith("{% for") and read_chat_template("{{ x }}") == "{{ x }}"
    with pytest.raises(SystemExit):
        read_chat_template("no/such/file.jinja")


def test_metrics_carry_vllms_names():
    pytest.importorskip("prometheus_client")
    from toolkit.serving.metrics import ServerMetrics

    m = ServerMetrics("tiny")
    m.prompt_tokens.labels("tiny").inc(3)
    text = m.render().decode()
    assert 'vllm:prompt_tokens_total{model_name="tiny"} 3.0' in text
    assert 'toolkit_prompt_tokens_total{model_name="tiny"} 3.0' in text
    assert "# TYPE vllm:num_requests_running gauge" in text
