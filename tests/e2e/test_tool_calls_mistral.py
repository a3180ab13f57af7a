"""Mistral-format tool calling end to end, on the tiny random Mistral
(tests/data/models/tiny-mistral.gguf, made by tools/reference/make_tiny_models.py:
[TOOL_CALLS] and the other markers are control tokens, and its chat template
writes "[TOOL_CALLS] [...]"). The weights are random, so only what a grammar
forces is checked: tool_choice "required" and a named function give
finish_reason "tool_calls" and calls whose arguments validate against the
tool's schema, whole and streamed; parallel_tool_calls false gives one call;
skip_special_tokens false shows a control token the model wrote (forced by a
Lark grammar), and a non-boolean skip_special_tokens is a 400. The tools'
strings are enums and patterns: a random model left free in a string would
write until max_tokens.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from openai import BadRequestError, OpenAI

from conftest import REPO, function_tool, start, stop, tool_schemas, weather_tool

TINY_MISTRAL = REPO / "tests/data/models/tiny-mistral.gguf"

WEATHER = weather_tool()
TIME = function_tool("get_time", {"zone": {"type": "string", "pattern": "^[A-Z][a-z]{2,6}/[A-Z][a-z]{2,6}$"}}, ["zone"],
                     "Get the local time in an IANA time zone.", closed=True)
SCHEMAS = tool_schemas(WEATHER, TIME)
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
COMMON = dict(model="smollm2", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=400)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    # Exact arithmetic: which seed closes the random model's parallel array (below) holds for the
    # arithmetic it was found under, and exact's is every host's.
    srv = start(tmp_path_factory.mktemp("tiny_mistral"), ["--numerics", "exact"], model=TINY_MISTRAL)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(mistral):
    return OpenAI(base_url=mistral.base_url + "/v1", api_key="none", max_retries=0)


def check_calls(calls, names=SCHEMAS):
    """Calls as (name, arguments text): each names a tool and its arguments validate."""
    for name, arguments in calls:
        assert name in names, name
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def stream_calls(client, **kwargs):
    """The streamed calls as (name, joined argument fragments), the content and the finish reason."""
    calls: dict[int, list] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.delta.content:
                content += choice.delta.content
            for tc in choice.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.id.startswith("call_") and tc.function.name, tc
                    calls[tc.index] = [tc.function.name, ""]
                calls[tc.index][1] += tc.function.arguments or ""
            if choice.finish_reason:
                finish = choice.finish_reason
    return [tuple(calls[i]) for i in sorted(calls)], content, finish


def test_format_comes_from_the_template(mistral):
    assert "tool calling: mistral format (from the chat template)" in mistral.log()


# Greedy, this random model never closes a parallel array (it writes calls until max_tokens, and
# the cut output stays content); sampled with seed 0 it closes it after several calls.
@pytest.mark.parametrize("parallel,sampling", [(False, {}), (True, {"temperature": 1.0, "seed": 0})])
def test_required_gives_valid_calls(client, parallel, sampling):
    choice = client.chat.completions.create(tool_choice="required", parallel_tool_calls=parallel,
                                            **{**COMMON, **sampling}).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    # The marker is a control token: shown to the parser, never left in the content.
    assert choice.message.content is None, choice.message.content
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert len(calls) > 1 if parallel else len(calls) == 1, calls
    check_calls(calls)
    assert len({c.id for c in choice.message.tool_calls}) == len(calls)


def test_named_function_is_called_once(client):
    choice = client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "get_time"}},
                                            **COMMON).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [name for name, _ in calls] == ["get_time"]
    check_calls(calls)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_match_the_whole_response(client, tool_choice):
    kwargs = dict(tool_choice=tool_choice, parallel_tool_calls=False, **COMMON)
    calls, content, finish = stream_calls(client, **kwargs)
    assert finish == "tool_calls"
    assert content == ""
    assert len(calls) == 1
    check_calls(calls)
    if isinstance(tool_choice, dict):
        assert calls[0][0] == "get_weather"
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole] == \
        [(name, json.loads(arguments)) for name, arguments in calls]


def test_skip_special_tokens_false_shows_control_tokens(mistral):
    # A grammar makes the model write the control token [INST], then text.
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
            "max_tokens": 20, "guided_grammar": 'start: <[3]> " hi"'}
    url = mistral.base_url + "/v1/chat/completions"
    hidden = requests.post(url, json=body, timeout=60)
    assert hidden.status_code == 200, hidden.text
    assert hidden.json()["choices"][0]["message"]["content"] == " hi"
    shown = requests.post(url, json={**body, "skip_special_tokens": False}, timeout=60)
    assert shown.status_code == 200, shown.text
    choice = shown.json()["choices"][0]
    assert choice["message"]["content"] == "[INST] hi"
    assert choice["finish_reason"] == "stop"
    # The same on /v1/completions, streamed.
    text = ""
    with requests.post(mistral.base_url + "/v1/completions", stream=True, timeout=60,
                       json={"model": "smollm2", "prompt": "[INST] Hi[/INST]", "temperature": 0, "max_tokens": 20,
                             "guided_grammar": 'start: " a" <[3]> "b"', "skip_special_tokens": False,
                             "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert text == " a[INST]b"


def test_skip_special_tokens_must_be_a_boolean(client, mistral):
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4,
                                       extra_body={"skip_special_tokens": "no"})
    assert e.value.status_code == 400
    r = requests.post(mistral.base_url + "/v1/completions",
                      json={"model": "smollm2", "prompt": "Hi", "max_tokens": 4, "skip_special_tokens": 0}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "skip_special_tokens"
