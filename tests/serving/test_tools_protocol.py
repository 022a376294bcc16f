"""Tool fields through HTTP on the tiny server: malformed `tools` / `tool_choice` get a 400
naming the field; fields SDKs send are accepted; the history renders with the default
(template without a tools section) and with a template's own tools section; forced calls
come out valid even from a random model."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from toolkit.serving.tools.registry import detect_tool_parser
from toolkit.serving.tools.request import ToolConfig, plan_tools
from toolkit.serving.tools.template import render_inputs

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
MSGS = [{"role": "user", "content": "Weather in Paris?"}]


def post(server, body):
    srv, _ = server
    return httpx.post(srv.url + "/v1/chat/completions", json={"model": "tiny", "messages": MSGS, **body},
                      timeout=60)


@pytest.mark.parametrize("tools,tool_choice,param", [
    ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name"),
    ([{"type": "function"}], None, "tools[0].function"),
    ([{"type": "retrieval", "function": {"name": "f"}}], None, "tools[0].type"),
    ([WEATHER, {"type": "function", "function": {"name": "g", "parameters": {"type": "objekt"}}}], None,
     "tools[1].function.parameters"),
    ([{"type": "function", "function": {"name": "g", "parameters": {"type": "string"}}}], None,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "g", "parameters": "not a schema"}}], None,
     "tools[0].function.parameters"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
    ([WEATHER], "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
    ([WEATHER, WEATHER], None, "tools"),
])
def test_malformed_tools_are_400_naming_the_field(server, tools, tool_choice, param):
    body = {"tools": tools}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    r = post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split(".")[-1].split("[")[0] in err["message"]


def test_bad_history_arguments_are_400(server):
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]
    r = post(server, {"messages": msgs, "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


def test_sdk_fields_are_accepted(server):
    r = post(server, {"max_tokens": 3, "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
                      "parallel_tool_calls": True, "tools": [WEATHER], "tool_choice": "none"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"].get("tool_calls") is None


def test_forced_calls_with_structured_outputs_conflict(server):
    r = post(server, {"tools": [WEATHER], "tool_choice": "required",
                      "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_from_a_random_model_are_valid(server, choice):
    """The tiny model is random weights: only the grammar makes its call valid."""
    r = post(server, {"tools": [WEATHER, {"type": "function", "function": {"name": "noop"}}],
                      "tool_choice": choice, "max_tokens": 120, "temperature": 1.0, "seed": 3,
                      "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
    choice0 = r.json()["choices"][0]
    calls = choice0["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    args = json.loads(calls[0]["function"]["arguments"])
    if calls[0]["function"]["name"] == "get_weather":
        jsonschema.validate(args, WEATHER["function"]["parameters"])
    else:
        assert calls[0]["function"]["name"] == "noop" and args == {}
    assert choice0["finish_reason"] == ("tool_calls" if choice == "required" else "stop")
    assert choice0["message"]["content"] is None


def test_auto_on_a_random_model_never_fails(server):
    r = post(server, {"tools": [WEATHER], "max_tokens": 20, "temperature": 1.0, "seed": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


# -- rendering -----------------------------------------------------------------------------
HISTORY = [{"role": "system", "content": "Be brief."}, *MSGS,
           {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"}]


def test_default_rendering_for_a_template_without_tools():
    server = ToolConfig().resolve("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    plan = plan_tools([WEATHER], None, None, server)
    msgs, kwargs = render_inputs(HISTORY, plan)
    assert kwargs == {} and msgs[0]["role"] == "system"
    assert msgs[0]["content"].startswith("Be brief.") and '"get_weather"' in msgs[0]["content"]
    assert "<tool_call>" in msgs[0]["content"]
    assert msgs[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                                  '"unit": "c"}}\n</tool_call>')
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}


def test_a_template_with_tools_gets_them_and_hf_shaped_history():
    template = "{% if tools %}{{ tools | tojson }}{% endif %}<tool_call>"
    assert detect_tool_parser(template) == "hermes"
    assert detect_tool_parser('{{ tools }} <|python_tag|> "parameters"') == "llama3_json"
    plan = plan_tools([WEATHER], "auto", None, ToolConfig().resolve(template))
    msgs, kwargs = render_inputs(HISTORY, plan)
    assert kwargs == {"tools": [WEATHER]}
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "c"}
    assert msgs[3]["role"] == "tool"
    none = plan_tools([WEATHER], "none", None, ToolConfig().resolve(template))
    assert render_inputs(HISTORY, none)[1] == {}                    # "none": the model is not told


def test_auto_needs_the_flag():
    from toolkit.serving.protocol import ProtocolError

    server = ToolConfig(enable_auto_tool_choice=False).resolve(None)
    with pytest.raises(ProtocolError, match="enable-auto-tool-choice"):
        plan_tools([WEATHER], None, None, server)
    assert plan_tools([WEATHER], "required", None, server).choice == "required"


def test_serve_flags():
    from toolkit.serve import parse_args

    args = parse_args(["--tool-call-parser", "llama3_json", "--no-enable-auto-tool-choice",
                       "--reasoning-parser", "qwen3"])
    assert (args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser) == \
        ("llama3_json", False, "qwen3")
    assert parse_args([]).tool_call_parser == "auto" and parse_args([]).enable_auto_tool_choice


def test_reasoning_and_a_call_streamed_and_not(tiny_chat_dir, make_server):
    """A random model made to write `<think>..</think><tool_call>..` (a regex): the server
    splits it into reasoning_content and a tool call, the same streamed and not."""
    import openai

    from toolkit.samplers.grammar.spec import escape_regex

    srv, _ = make_server(tiny_chat_dir, tools=ToolConfig(reasoning_parser="qwen3"))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    regex = ("<think>[a-z]{1,6}</think>" + escape_regex('<tool_call>\n{"name": "get_weather", "arguments": '
                                                         '{"city": "') + '[a-z]{1,5}' +
             escape_regex('", "unit": "c"}}\n</tool_call>'))
    kw = {"model": "tiny", "messages": MSGS, "tools": [WEATHER], "max_tokens": 250, "temperature": 0,
              "extra_body": {"structured_outputs": {"regex": regex}}}
    full = c.chat.completions.create(**kw).choices[0]
    thought = full.message.model_extra["reasoning_content"]
    assert thought and thought.isalpha() and full.message.content is None
    (call,) = full.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["unit"] == "c"
    assert full.finish_reason == "tool_calls"
    chunks = [ch for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
    reasoning = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks)
    args = "".join(tc.function.arguments or "" for ch in chunks for tc in ch.choices[0].delta.tool_calls or [])
    assert reasoning == thought and args == call.function.arguments
    assert not any(ch.choices[0].delta.content for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_format_of_ones_own_is_a_part():
    from toolkit.serving.tools import llama3_json

    server = ToolConfig(tool_call_parser=llama3_json).resolve(None)
    plan = plan_tools([WEATHER], "auto", None, server)
    out = plan.parser().parse('{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}')
    assert server.parser_name == "llama3_json" and out.tool_calls[0].name == "get_weather"
    with pytest.raises(ValueError, match="valid"):
        ToolConfig(tool_call_parser="mistral").resolve(None)


def test_n2_streamed_calls_are_indexed_per_choice(server):
    import openai

    srv, _ = server
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=MSGS, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, n=2, max_tokens=120, temperature=1.0,
                                            seed=5, stream=True))
    args: dict[int, str] = {0: "", 1: ""}
    for ch in chunks:
        for choice in ch.choices:
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0                                # one call in each choice
                args[choice.index] += tc.function.arguments or ""
    for a in args.values():
        jsonschema.validate(json.loads(a), WEATHER["function"]["parameters"])


def test_a_call_cut_off_by_max_tokens_is_content_when_not_streamed(server):
    r = post(server, {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 4})
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "length"
    text = choice["message"]["content"]                             # the forced call's start, as text
    assert choice["message"]["tool_calls"] is None and text.startswith("<tool")
    assert ('<tool_call>\n{"name": "get_weather", "arguments": ').startswith(text[:48])


def test_a_forced_call_is_not_read_as_reasoning():
    server = ToolConfig(reasoning_parser="deepseek_r1").resolve(None)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    forced = plan_tools([WEATHER], "required", None, server).parser().parse(text)
    assert forced.reasoning is None and forced.tool_calls[0].name == "get_weather"
    auto = plan_tools([WEATHER], "auto", None, server).parser().parse("hmm</think>" + text)
    assert auto.reasoning == "hmm" and auto.tool_calls[0].name == "get_weather"
