"""Tool calling through the real clients (openai, langchain-openai, instructor) against the
server over the embedded SmolLM2-135M-Instruct: named and required tool_choice, streamed and
not, a tool-result turn; arguments validate against the tool's schema with jsonschema."""

from __future__ import annotations

import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow            # a real 135M model on the CPU: seconds a request

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def real_server():
    from server_util import start_server

    from toolkit.models import default_model_path

    srv, _engine = start_server(default_model_path())
    yield srv
    srv.stop()


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def valid(call) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_named_tool_choice_streamed_and_not(real_server):
    c = client(real_server)
    kw = {"model": "tiny", "messages": ASK, "tools": [WEATHER, TIME], "max_tokens": 80, "temperature": 0,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    full = c.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    valid(call)

    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    pieces = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    first, rest = pieces[0], pieces[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather") and first.id
    assert rest and all(p.id is None and p.function.name is None and p.index == 0 for p in rest)
    args = first.function.arguments + "".join(p.function.arguments for p in rest)
    assert args == call.function.arguments                          # greedy: the same call
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_required_picks_a_valid_call(real_server):
    r = client(real_server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=80,
        temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    valid(choice.message.tool_calls[0])


def test_tool_result_turn(real_server):
    c = client(real_server)
    first = c.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                      max_tokens=80, temperature=0)
    msg = first.choices[0].message
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 C and sunny"}]
    r = c.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=30,
                                  temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    for call in choice.message.tool_calls or []:                    # auto: whatever it chose, valid
        valid(call)


def test_langchain_bind_tools_and_structured_output(real_server):
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        """Get the current weather in a city."""

        city: str = Field(description="The city")
        unit: str = Field(description="c or f")

    class Person(BaseModel):
        name: str
        age: int

    llm = lc.ChatOpenAI(base_url=real_server.url + "/v1", api_key="none", model="tiny", temperature=0,
                        max_tokens=60, max_retries=0)
    msg = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What's the weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "GetWeather" and GetWeather(**call["args"])
    chunks = list(llm.bind_tools([GetWeather], tool_choice="any").stream("What's the weather in Paris?"))
    total = chunks[0]
    for ch in chunks[1:]:
        total = total + ch
    assert [tc["name"] for tc in total.tool_calls] == ["GetWeather"] and GetWeather(**total.tool_calls[0]["args"])
    person = llm.with_structured_output(Person, method="function_calling").invoke("John is 30 years old.")
    assert isinstance(person, Person)


def test_instructor_tools_mode(real_server):
    instructor = pytest.importorskip("instructor")
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    ic = instructor.from_openai(client(real_server))                # default mode: TOOLS
    person = ic.chat.completions.create(model="tiny", response_model=Person, max_tokens=60, temperature=0,
                                        messages=[{"role": "user", "content": "John is 30 years old."}],
                                        max_retries=0)
    assert isinstance(person, Person)


def test_openai_sdk_parse_and_stream_helpers(real_server):
    """The SDK's own accumulators: `parse` (strict pydantic tools) and `stream`'s final completion."""
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str
        unit: str

    c = client(real_server)
    kw = {"model": "tiny", "messages": ASK, "tools": [openai.pydantic_function_tool(GetWeather)],
          "tool_choice": "required", "max_tokens": 80, "temperature": 0}
    parsed = c.chat.completions.parse(**kw).choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, GetWeather)
    with c.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.tool_calls[0].function.parsed_arguments == parsed
