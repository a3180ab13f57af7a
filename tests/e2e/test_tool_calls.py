"""Tool calling through the official openai client, on Qwen2.5-Coder-0.5B-Instruct
(its chat template supports tools; hermes format, <tool_call>{...}</tool_call>):
tool_choice required (greedy and sampled) and named give calls whose arguments
validate against the tool's schema; auto parses what the model wrote;
streamed calls come as OpenAI streams them (id and name first, then argument
fragments); parallel calls; a whole round trip (call, tool result, answer);
and the 400s: a model whose template has no tools (the default SmolLM2), bad
tools and tool_choice. Skips when the Qwen model file is absent.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from openai import BadRequestError, OpenAI

from conftest import MODEL_DIR, UNIT_ENUM, function_tool, start, stop, tool_schemas, weather_tool, require_model

QWEN = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

WEATHER = weather_tool({"city": {"type": "string", "description": "The city, e.g. Paris"}, "unit": UNIT_ENUM})
TIME = function_tool("get_time", {"timezone": {"type": "string", "description": "e.g. Asia/Tokyo"}}, ["timezone"],
                     "Get the current local time in an IANA time zone.", closed=True)
SCHEMAS = tool_schemas(WEATHER, TIME)
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    require_model(QWEN)
    srv = start(tmp_path_factory.mktemp("qwen_tools"), model=QWEN)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(qwen):
    return OpenAI(base_url=qwen.base_url + "/v1", api_key="none", max_retries=0)


def check_call(call, names=SCHEMAS):
    """A call in OpenAI's shape whose arguments validate against its tool's schema."""
    assert call.type == "function"
    assert call.id.startswith("call_") and len(call.id) == 29 and call.id[5:].isalnum(), call.id
    assert call.function.name in names, call.function.name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}, {"temperature": 1.0, "seed": 8}])
def test_required_gives_a_valid_call(client, sampling):
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                       tool_choice="required", parallel_tool_calls=False, max_tokens=60, **sampling)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])


def test_named_function_is_called(client):
    # The question is about the weather, but the client names get_time.
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    check_call(choice.message.tool_calls[0])


def test_auto_parses_what_the_model_wrote(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                       max_tokens=80, temperature=0, n=2, seed=3)
    for choice in r.choices:
        message = choice.message
        if message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in message.tool_calls:
                check_call(call)
            assert message.content is None or "<tool_call>" not in message.content
        else:
            assert choice.finish_reason in ("stop", "length")
            assert isinstance(message.content, str) and message.content
    # The greedy answer to a question that clearly needs the tool is a call.
    greedy = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                            max_tokens=80, temperature=0).choices[0]
    assert greedy.message.tool_calls, greedy.message.content
    assert greedy.message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_parses_nothing(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                       tool_choice="none", max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")


def stream_calls(client, **kwargs):
    """The streamed calls (id, name, joined arguments), the content and the finish reason."""
    calls: dict[int, dict] = {}
    content = ""
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content += delta.content
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    # The first chunk of a call carries its id, type and name.
                    assert tc.id and tc.id.startswith("call_"), tc
                    assert tc.type == "function" and tc.function.name, tc
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and (tc.function.name is None), tc
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                finish = choice.finish_reason
    return [calls[i] for i in sorted(calls)], content, finish


def test_streamed_required_call(client):
    calls, content, finish = stream_calls(client, model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                          tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                          temperature=0)
    assert finish == "tool_calls"
    assert content == ""
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])
    # The same call as the whole response gives.
    whole = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                           temperature=0).choices[0].message.tool_calls[0]
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == (whole.function.name,
                                                                    json.loads(whole.function.arguments))


def test_streamed_auto_keeps_markers_out_of_content(client):
    calls, content, finish = stream_calls(client, model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                          max_tokens=80, temperature=0)
    assert "<tool_call>" not in content and "</tool_call>" not in content
    if calls:
        assert finish == "tool_calls"
        for call in calls:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_parallel_calls(client):
    messages = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]
    r = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER, TIME],
                                       tool_choice="required", parallel_tool_calls=True, max_tokens=120,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) >= 1
    ids = set()
    for call in choice.message.tool_calls:
        check_call(call)
        ids.add(call.id)
    assert len(ids) == len(choice.message.tool_calls)


def test_round_trip(client, qwen):
    first = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                           temperature=0)
    call = first.choices[0].message.tool_calls[0]
    result = json.dumps({"temperature_celsius": 18, "sky": "cloudy"})
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    # The tools are still rendered; tool_choice "none" asks for the answer (the
    # 0.5B model, left to choose, tends to call again).
    final = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], tool_choice="none",
                                           max_tokens=40, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice
    assert choice.message.tool_calls is None
    assert choice.message.content
    # The call and its result went into the prompt through the template.
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + 20
    # The same conversation, tokenized by the server, holds the call (its
    # arguments as the object, as templates write them) and the result.
    tokens = requests.post(qwen.base_url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    text = requests.post(qwen.base_url + "/detokenize", json={"tokens": tokens}, timeout=30).json()["prompt"]
    arguments = json.dumps(json.loads(call.function.arguments))
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' + arguments + "}\n</tool_call>" in text, text
    assert "<tool_response>\n" + result + "\n</tool_response>" in text, text


def test_bad_tools_and_tool_choice(client):
    bad = [
        dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}),
        dict(tools=[WEATHER], tool_choice="sometimes"),
        dict(tools=[{"type": "function", "function": {"name": "has space"}}]),
        dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "nope"}}]),
        dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
        dict(tool_choice="required"),
    ]
    for kwargs in bad:
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, max_tokens=5, **kwargs)
        assert e.value.status_code == 400, kwargs


def test_template_without_tools_is_a_400(server):
    r = requests.post(server.base_url + "/v1/chat/completions",
                      json={"messages": ASK_WEATHER, "tools": [WEATHER], "max_tokens": 5}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "template" in error["message"] and "tools" in error["message"], error
    assert error["param"] == "tools"


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_json_schemas_on_qwen(client, qwen, mode):
    """The structured-output schemas (test_structured_outputs.py) on this model too:
    every answer finishes by the grammar and validates."""
    from test_structured_outputs import RAW_SCHEMAS, check_schema_answers, run_all, sampling

    def job(i, name):
        def call():
            return client.chat.completions.create(
                model=qwen.model, max_tokens=300, messages=[{"role": "user", "content": f"Example {name} JSON."}],
                response_format={"type": "json_schema", "json_schema": {"name": name, "schema": RAW_SCHEMAS[name]}},
                **sampling(mode, i))
        return call

    names = list(RAW_SCHEMAS)
    check_schema_answers(names, run_all([job(i, n) for i, n in enumerate(names)]))
