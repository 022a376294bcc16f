"""The OpenAI request models and their mapping to SamplingParams (no server)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from pydantic import ValidationError  # noqa: E402

from toolkit.serving import protocol as P  # noqa: E402


def chat(**kw):
    return P.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)


def test_every_sampling_field_maps():
    sp = chat(temperature=0.3, top_p=0.8, top_k=5, min_p=0.1, n=2, max_completion_tokens=9, stop="END",
              seed=4, logprobs=True, top_logprobs=3, presence_penalty=0.5, frequency_penalty=-0.5,
              repetition_penalty=1.2, logit_bias={"17": -100, "3": 2.5}, min_tokens=2,
              stop_token_ids=[7], ignore_eos=True, skip_special_tokens=False,
              include_stop_str_in_output=True).sampling_params(max_model_len=100, prompt_len=10)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.n, sp.max_tokens) == (0.3, 0.8, 5, 0.1, 2, 9)
    assert sp.stop == ["END"] and sp.seed == 4 and sp.logprobs == 3
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.5, -0.5, 1.2)
    assert sp.logit_bias == {17: -100.0, 3: 2.5} and sp.min_tokens == 2 and sp.stop_token_ids == [7]
    assert sp.ignore_eos and not sp.skip_special_tokens and sp.include_stop_str_in_output


def test_defaults_follow_openai():
    # chat without max_tokens: what the context leaves; completions: 16; temperature 1
    assert chat().sampling_params(100, 30).max_tokens == 70
    c = P.CompletionRequest(prompt="x")
    sp = c.sampling_params(100, 30)
    assert sp.max_tokens == 16 and sp.temperature == 1.0 and sp.logprobs is None
    assert chat(logprobs=True).sampling_params(100, 1).logprobs == 0     # the sampled token only
    assert chat(max_tokens=5, max_completion_tokens=7).sampling_params(100, 1).max_tokens == 7


def test_structured_outputs_in_each_spelling():
    pytest.importorskip("outlines_core")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert chat(response_format=rf).sampling_params(100, 1).structured.kind == "json"
    assert chat(response_format={"type": "json_object"}).sampling_params(100, 1).structured.kind == "json_object"
    assert chat(response_format={"type": "text"}).sampling_params(100, 1).structured is None
    assert chat(structured_outputs={"regex": "[0-9]+"}).sampling_params(100, 1).structured.kind == "regex"
    assert chat(guided_choice=["yes", "no"]).sampling_params(100, 1).structured.kind == "choice"
    with pytest.raises(P.ProtocolError, match="one structured output at a time"):
        chat(guided_regex="a", response_format={"type": "json_object"}).sampling_params(100, 1)
    with pytest.raises(P.ProtocolError, match="exactly one"):
        chat(structured_outputs={"regex": "a", "choice": ["b"]}).sampling_params(100, 1)


@pytest.mark.parametrize("kw, param", [
    (dict(temperature=-0.5), "temperature"), (dict(top_p=0.0), "top_p"), (dict(n=0), "n"),
    (dict(logit_bias={"x": 1}), "logit_bias"), (dict(logit_bias={"1": 500}), "logit_bias"),
    (dict(max_tokens=95), "max_tokens"), (dict(max_tokens=0), "max_tokens"),
    (dict(top_logprobs=2), "top_logprobs"),   # tools: test_tools_protocol.py (checked in serving/tools)
])
def test_bad_values_name_their_parameter(kw, param):
    with pytest.raises(P.ProtocolError) as e:
        chat(**kw).sampling_params(max_model_len=100, prompt_len=10)
    assert e.value.param == param and e.value.status == 400
    assert e.value.body()["error"]["param"] == param


def test_unknown_fields_and_bad_shapes_are_refused():
    with pytest.raises(ValidationError, match="extra"):
        chat(temprature=0.5)
    with pytest.raises(ValidationError):
        P.ChatCompletionRequest(messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(ValidationError):
        chat(top_logprobs=50, logprobs=True)
    with pytest.raises(P.ProtocolError, match="context length"):
        P.CompletionRequest(prompt="x").sampling_params(max_model_len=10, prompt_len=10)


def test_prompt_forms_and_content_parts():
    assert P.CompletionRequest(prompt="a").prompts() == ["a"]
    assert P.CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert P.CompletionRequest(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]
    assert P.CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    req = P.ChatCompletionRequest(messages=[{"role": "user", "content": [
        {"type": "text", "text": "one "}, {"type": "text", "text": "two"}]}])
    assert req.template_messages() == [{"role": "user", "content": "one two"}]
    assert P.finish_reason("grammar") == "stop" and P.finish_reason("length") == "length"
