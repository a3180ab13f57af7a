"""Reasoning output (--reasoning-parser) through the official openai client, on
Qwen2.5-Coder-0.5B-Instruct. That model does not think by itself, so a few-shot
conversation teaches it to answer as <think>...</think> then the answer (its
template has no <think>, as Qwen3's: the output opens the thinking, the qwen3
parser). Checked: the thinking comes back as message.reasoning_content and the
answer as content, streamed too (reasoning deltas first, then content); a JSON
schema or a forced tool call constrains the answer only (with the grammar from
the first token there would be no thinking at all, which these tests catch);
thinking cut by max_tokens finishes with "length"; reasoning_format "none"
per request; and the default model (its template never thinks) is unchanged.
Skips when the Qwen model file is absent.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from openai import OpenAI

from conftest import MODEL_DIR, MODEL_NAME, REPO, start, stop, weather_tool, require_model

QWEN = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

CITY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
    "required": ["name", "population"],
    "additionalProperties": False,
}
CITY_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
FEW_SHOT = [
    {"role": "system", "content": "First think step by step inside <think></think>, then answer with one JSON object."},
    {"role": "user", "content": "City: Paris"},
    {"role": "assistant", "content": "<think>\nParis is the capital of France. About 2,100,000 people live there.\n"
                                     "</think>\n\n{\"name\": \"Paris\", \"population\": 2100000}"},
    {"role": "user", "content": "City: Berlin"},
    {"role": "assistant", "content": "<think>\nBerlin is the capital of Germany. About 3,600,000 people live there.\n"
                                     "</think>\n\n{\"name\": \"Berlin\", \"population\": 3600000}"},
    {"role": "user", "content": "City: Madrid"},
]
WEATHER = weather_tool({"city": {"type": "string"}})
TOOL_FEW_SHOT = [
    {"role": "system", "content": "Think inside <think></think> first, then call a tool or answer."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>\nThe user wants the weather in Paris, so I call get_weather.\n</think>",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "<think>\nThe tool says 18 C and sunny.\n</think>\n\nIt is 18 C and sunny in Paris."},
    {"role": "user", "content": "Weather in Tokyo?"},
]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    require_model(QWEN)
    srv = start(tmp_path_factory.mktemp("qwen_reasoning"), ["--reasoning-parser", "qwen3"], model=QWEN)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(qwen):
    return OpenAI(base_url=qwen.base_url + "/v1", api_key="none", max_retries=0)


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def streamed(client, **kwargs):
    """(reasoning, content, finish_reason, tool calls) of a streamed answer;
    fails if a reasoning delta comes after a content delta."""
    reasoning, content, finish, calls = "", "", None, {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        r = (delta.model_extra or {}).get("reasoning_content")
        if r:
            assert not content.strip(), f"reasoning {r!r} after content {content!r}"
            reasoning += r
        if delta.content:
            content += delta.content
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            if call.function.name:
                entry["name"] = call.function.name
            entry["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return reasoning, content, finish, calls


@pytest.fixture(scope="module")
def city_answer(client):
    return client.chat.completions.create(model=MODEL_NAME, messages=FEW_SHOT, response_format=CITY_FORMAT,
                                          temperature=0, max_tokens=80).choices[0]


def test_json_schema_constrains_the_answer_not_the_thinking(city_answer):
    assert city_answer.finish_reason == "stop", city_answer
    reasoning = reasoning_of(city_answer.message)
    assert reasoning and "Madrid" in reasoning, city_answer.message
    assert "<think>" not in reasoning and "</think>" not in reasoning
    jsonschema.validate(json.loads(city_answer.message.content), CITY)


def test_json_schema_streamed_splits_as_the_whole_response(client, city_answer):
    reasoning, content, finish, _ = streamed(client, model=MODEL_NAME, messages=FEW_SHOT, response_format=CITY_FORMAT,
                                             temperature=0, max_tokens=80)
    assert finish == "stop"
    assert reasoning == reasoning_of(city_answer.message) and reasoning
    assert content == city_answer.message.content
    jsonschema.validate(json.loads(content), CITY)


def test_without_a_grammar_the_thinking_is_split_too(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=FEW_SHOT, temperature=0, max_tokens=80)
    message = r.choices[0].message
    assert reasoning_of(message)
    assert "<think>" not in message.content and not message.content.startswith("\n")


def test_thinking_cut_by_max_tokens_finishes_with_length(client):
    for stream in (False, True):
        kwargs = dict(model=MODEL_NAME, messages=FEW_SHOT, response_format=CITY_FORMAT, temperature=0, max_tokens=6)
        if stream:
            reasoning, content, finish, _ = streamed(client, **kwargs)
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            reasoning, content, finish = reasoning_of(choice.message), choice.message.content, choice.finish_reason
        assert finish == "length"
        assert reasoning  # the thinking so far, unconstrained
        assert not content


def test_forced_tool_call_after_thinking(client):
    for stream in (False, True):
        kwargs = dict(model=MODEL_NAME, messages=TOOL_FEW_SHOT, tools=[WEATHER], tool_choice="required",
                      parallel_tool_calls=False, temperature=0, max_tokens=80)
        if stream:
            reasoning, content, finish, calls = streamed(client, **kwargs)
            calls = [calls[i] for i in sorted(calls)]
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            reasoning, content, finish = reasoning_of(choice.message), choice.message.content, choice.finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
        assert finish == "tool_calls", (reasoning, content)
        assert reasoning and "Tokyo" in reasoning
        assert not content
        assert [c["name"] for c in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_reasoning_format_none_per_request(qwen):
    body = {"messages": FEW_SHOT, "temperature": 0, "max_tokens": 40, "reasoning_format": "none"}
    message = requests.post(qwen.base_url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"].startswith("<think>")
    bad = requests.post(qwen.base_url + "/v1/chat/completions", json={**body, "reasoning_format": "thoughts"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_format"


def test_default_model_does_not_split(server):
    # SmolLM2's template never writes </think>: reasoning is off by default.
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    message = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert "reasoning_content" not in message


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    # A random tiny Qwen3 with a template that thinks: --reasoning-parser's default (auto) turns reasoning on.
    srv = start(tmp_path_factory.mktemp("tiny_qwen3"), ["--chat-template", str(REPO / "tests/data/chat/qwen3_thinking.jinja")],
                model=REPO / "tests/data/models/tiny-qwen3.gguf")
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


def tiny_message(srv, **extra):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, **extra}
    r = requests.post(srv.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_template_that_thinks_turns_reasoning_on_and_enable_thinking_passes_through(tiny_qwen3):
    assert "reasoning: qwen3 parser (the chat template writes </think>)" in tiny_qwen3.log()
    raw = tiny_message(tiny_qwen3, reasoning_format="none")["content"]
    # Thinking enabled (Qwen3's default): split; this random model does not open <think>, so all is content.
    on = tiny_message(tiny_qwen3)
    assert "reasoning_content" in on
    if not raw.lstrip().startswith("<think>"):
        assert on["reasoning_content"] is None and on["content"] == raw
    # enable_thinking=false: the prompt closed the thinking, nothing to split.
    off = tiny_message(tiny_qwen3, chat_template_kwargs={"enable_thinking": False})
    assert "reasoning_content" not in off
    # The prompt opened <think>: the output starts inside the thinking (deepseek_r1's case).
    raw_open = tiny_message(tiny_qwen3, chat_template_kwargs={"open_think": True}, reasoning_format="none")["content"]
    inside = tiny_message(tiny_qwen3, chat_template_kwargs={"open_think": True})
    if "</think>" not in raw_open:
        assert inside["reasoning_content"] == (raw_open.strip() or None) and inside["content"] is None
