"""Qwen3-Coder's XML tool calls end to end through the official openai client,
on the tiny random Qwen3 (tests/data/models/tiny-qwen3.gguf) given
Qwen3-Coder's chat template (tests/data/chat/qwen3_coder.jinja, llama.cpp's
vendored copy) with --chat-template: the server picks the qwen3_coder format
from the template (<function=). The weights are random, so only what a grammar
forces is checked: tool_choice "required" and a named function give
finish_reason "tool_calls" and calls whose arguments are typed by the schema
(an enum string stays a string, a boolean is a boolean) and validate, whole
and streamed alike; parallel_tool_calls false gives one call. The string
parameters are enums: a random model left free in a string would write until
max_tokens.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai import OpenAI

from conftest import REPO, start, stop

TINY_QWEN3 = REPO / "tests/data/models/tiny-qwen3.gguf"
TEMPLATE = REPO / "tests/data/chat/qwen3_coder.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Tokyo"]},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "metric"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["zone"], "additionalProperties": False},
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
COMMON = dict(model="smollm2", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=200)


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("tiny_qwen3_coder"), ["--chat-template", str(TEMPLATE)], model=TINY_QWEN3)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(coder):
    return OpenAI(base_url=coder.base_url + "/v1", api_key="none", max_retries=0)


def check_calls(calls):
    for name, arguments in calls:
        assert name in SCHEMAS, name
        args = json.loads(arguments)
        jsonschema.validate(args, SCHEMAS[name])
        if name == "get_weather":
            assert isinstance(args["metric"], bool) and isinstance(args["city"], str)


def stream_calls(client, **kwargs):
    calls: dict[int, list] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.id.startswith("call_") and tc.function.name, tc
                    calls[tc.index] = [tc.function.name, ""]
                calls[tc.index][1] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], content, finish


def test_format_comes_from_the_template(coder):
    assert "tool calling: qwen3_coder format (from the chat template)" in coder.log(), coder.log()[-3000:]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_whole_and_streamed(client, tool_choice):
    kwargs = dict(tool_choice=tool_choice, parallel_tool_calls=False, **COMMON)
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message.content
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert len(whole) == 1
    check_calls(whole)
    if isinstance(tool_choice, dict):
        assert whole[0][0] == "get_weather"
    calls, content, finish = stream_calls(client, **kwargs)
    assert finish == "tool_calls" and content == ""
    check_calls(calls)
    assert [(n, json.loads(a)) for n, a in calls] == [(n, json.loads(a)) for n, a in whole]


def test_parallel_calls_sampled(client):
    # Sampled, the random model sometimes writes a second call after the first.
    choice = client.chat.completions.create(tool_choice="required", parallel_tool_calls=True,
                                            **{**COMMON, "temperature": 1.0, "seed": 3}).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    if choice.finish_reason == "tool_calls":
        assert calls
        check_calls(calls)
    else:
        assert choice.finish_reason == "length"
