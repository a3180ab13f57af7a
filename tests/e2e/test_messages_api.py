"""Anthropic's Messages API (/v1/messages) through the official `anthropic` client: whole and streamed
messages (Anthropic's events in their order, each `event:` line naming its data's type), stop_sequences and
max_tokens as stop reasons, count_tokens, x-api-key authentication, thinking blocks from a reasoning parser,
tools with a tool_result round trip on Qwen2.5-Coder-0.5B, and bad requests answered in Anthropic's error shape.

The conversion is checked against the Chat Completions path: the same conversation, greedy, gives the same
text through both APIs and the same prompt tokens (count_tokens against /tokenize).
"""
from __future__ import annotations

import json
import socket

import anthropic
import jsonschema
import pytest
import requests
from openai import OpenAI

from conftest import MODEL_DIR, read_until, start, stop, require_model

QWEN = MODEL_DIR / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
KEY = "messages-test-key"
GREEDY = {"extra_body": {"temperature": 0}}  # this client version no longer takes `temperature` itself
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
SYSTEM = "You are a helpful assistant. Answer in one sentence."

WEATHER_SCHEMA = {"type": "object",
                  "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Tokyo"]},
                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.", "input_schema": WEATHER_SCHEMA}
WEATHER_OPENAI = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                   "parameters": WEATHER_SCHEMA}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("messages"), api_key=KEY)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(smol):
    return anthropic.Anthropic(base_url=smol.base_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def openai_client(smol):
    return OpenAI(base_url=smol.base_url + "/v1", api_key=KEY, max_retries=0)


def sse_events(response: requests.Response) -> list[tuple[str, dict]]:
    """The (event name, data) pairs of a raw SSE stream."""
    events, name = [], None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: "):])))
            name = None
    return events


def test_create_gives_a_message_like_chat_completions(client, openai_client):
    r = client.messages.create(model="smollm2", max_tokens=24, system=SYSTEM, messages=ASK, metadata={"user_id": "u1"},
                               **GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == "smollm2"
    assert r.id.startswith("msg_") and len(r.id) > 10
    assert [b.type for b in r.content] == ["text"]
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 0 < r.usage.output_tokens <= 24
    # The same conversation through Chat Completions, greedy: the same answer and usage.
    chat = openai_client.chat.completions.create(model="smollm2", max_tokens=24, temperature=0,
                                                 messages=[{"role": "system", "content": SYSTEM}] + ASK)
    assert r.content[0].text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]


def test_system_as_blocks_and_content_as_blocks(client):
    plain = client.messages.create(model="smollm2", max_tokens=16, system=SYSTEM, messages=ASK, **GREEDY)
    blocks = client.messages.create(
        model="smollm2", max_tokens=16, system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"]}]}], **GREEDY)
    assert blocks.content[0].text == plain.content[0].text
    assert blocks.usage.input_tokens == plain.usage.input_tokens


def test_max_tokens_is_the_stop_reason_at_the_limit(client):
    r = client.messages.create(model="smollm2", max_tokens=3, messages=[{"role": "user", "content": "Tell a long story."}],
                               **GREEDY)
    assert r.stop_reason == "max_tokens"
    assert r.usage.output_tokens == 3


def test_stream_sends_anthropic_events_in_order(smol, client):
    whole = client.messages.create(model="smollm2", max_tokens=20, messages=ASK, **GREEDY)
    body = {"model": "smollm2", "max_tokens": 20, "messages": ASK, "stream": True, "temperature": 0}
    with requests.post(smol.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY}, stream=True,
                       timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    names = [n for n, _ in events]
    for name, data in events:
        assert data["type"] == name
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas) == whole.content[0].text
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == whole.stop_reason
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens


def test_client_stream_accumulates_the_same_message(client):
    whole = client.messages.create(model="smollm2", max_tokens=20, system=SYSTEM, messages=ASK, **GREEDY)
    with client.messages.stream(model="smollm2", max_tokens=20, system=SYSTEM, messages=ASK, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequences(client):
    whole = client.messages.create(model="smollm2", max_tokens=30, messages=ASK, **GREEDY)
    text = whole.content[0].text
    words = text.split()
    assert len(words) >= 4, text
    stop_word = words[2]
    cut = text[:text.index(stop_word)]
    r = client.messages.create(model="smollm2", max_tokens=30, messages=ASK, stop_sequences=[stop_word, "zzqx"],
                               **GREEDY)
    assert r.stop_reason == "stop_sequence"
    assert r.stop_sequence == stop_word
    assert r.content[0].text == cut.rstrip() or r.content[0].text == cut
    with client.messages.stream(model="smollm2", max_tokens=30, messages=ASK, stop_sequences=[stop_word],
                                **GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop_word


def test_count_tokens_matches_the_prompt(smol, client):
    counted = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=ASK)
    created = client.messages.create(model="smollm2", max_tokens=1, system=SYSTEM, messages=ASK)
    assert counted.input_tokens == created.usage.input_tokens
    tokens = requests.post(smol.base_url + "/tokenize", headers=smol.headers(), timeout=30,
                           json={"messages": [{"role": "system", "content": SYSTEM}] + ASK}).json()["tokens"]
    assert counted.input_tokens == len(tokens)


def test_authentication(smol):
    # x-api-key (the client's way), and Bearer (auth_token) as well.
    assert anthropic.Anthropic(base_url=smol.base_url, api_key=KEY, max_retries=0).messages.create(
        model="smollm2", max_tokens=1, messages=ASK).type == "message"
    assert anthropic.Anthropic(base_url=smol.base_url, auth_token=KEY, max_retries=0).messages.create(
        model="smollm2", max_tokens=1, messages=ASK).type == "message"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=smol.base_url, api_key="wrong", max_retries=0).messages.create(
            model="smollm2", max_tokens=1, messages=ASK)
    assert e.value.status_code == 401
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    r = requests.post(smol.base_url + "/v1/messages", json={"model": "smollm2", "max_tokens": 1, "messages": ASK},
                      headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


BAD_REQUESTS = [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "image"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]}, "document"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nothing", "content": "18 C"}]}]}, "tool_use"),
    ({"max_tokens": 8, "messages": ASK, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "x"}]}, "input_schema"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 10}}, "budget_tokens"),
    ({"max_tokens": 8, "messages": ASK + [{"role": "assistant", "content": "Red"}]}, "assistant"),
]


@pytest.mark.parametrize("body,named", BAD_REQUESTS)
def test_bad_requests_get_anthropic_errors(client, body, named):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.post("/v1/messages", body={"model": "smollm2", **body}, cast_to=anthropic.types.Message)
    assert e.value.status_code == 400
    err = e.value.body
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert named in err["error"]["message"], err


def test_unknown_model_and_not_json(smol, client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-unknown-model", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    r = requests.post(smol.base_url + "/v1/messages", data=b"{not json", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.get(smol.base_url + "/v1/messages", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 405 and r.json()["type"] == "error"
    # The server still answers after the bad requests.
    assert client.messages.create(model="smollm2", max_tokens=2, messages=ASK).type == "message"


def anthropic_error(r: requests.Response, status: int, error_type: str) -> str:
    """The message of an error in Anthropic's shape (not OpenAI's), checked."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == error_type, body
    return body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_http_layer_errors_in_anthropic_shape(smol, client, path):
    url = smol.base_url + path
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    body = json.dumps({"model": "smollm2", "max_tokens": 8, "messages": ASK})
    # Malformed JSON, and JSON sent as another media type.
    message = anthropic_error(requests.post(url, data=b"{not json", headers={**headers, "Content-Type": "application/json"},
                                            timeout=30), 400, "invalid_request_error")
    assert "JSON" in message, message
    message = anthropic_error(requests.post(url, data=body, headers={**headers, "Content-Type": "text/plain"},
                                            timeout=30), 400, "invalid_request_error")
    assert "Content-Type" in message and "text/plain" in message, message
    # A body over the limit (16 MiB), sent whole, and announced alone by Content-Length.
    big = json.dumps({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * (17 << 20)}]})
    anthropic_error(requests.post(url, data=big, headers={**headers, "Content-Type": "application/json"}, timeout=60),
                    413, "request_too_large")
    port = int(smol.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 100000000\r\n\r\n{{".encode())
        reply = read_until(s, b"}}")
    head, _, payload = reply.decode(errors="replace").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), head
    assert json.loads(payload)["error"]["type"] == "request_too_large", payload
    # The server still answers.
    assert client.messages.create(model="smollm2", max_tokens=2, messages=ASK).type == "message"


# ---- thinking: SmolLM2 with --reasoning-parser deepseek_r1 (its output starts inside the thinking) ----

@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("messages_thinking"), ["--reasoning-parser", "deepseek_r1"])
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


def test_thinking_blocks(thinker):
    client = anthropic.Anthropic(base_url=thinker.base_url, api_key="none", max_retries=0)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    r = client.messages.create(model="smollm2", max_tokens=1100, messages=ASK, thinking=thinking,
                               stop_sequences=["."], **GREEDY)
    assert r.content and r.content[0].type == "thinking", r.content
    # The thinking is what the chat API returns as reasoning_content for the same request.
    chat = OpenAI(base_url=thinker.base_url + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="smollm2", max_tokens=1100, messages=ASK, temperature=0, stop=["."],
        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert r.content[0].thinking == chat.choices[0].message.reasoning_content
    with client.messages.stream(model="smollm2", max_tokens=1100, messages=ASK, thinking=thinking,
                                stop_sequences=["."], **GREEDY) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds and set(kinds) == {"thinking_delta"}
    assert final.content[0].type == "thinking" and final.content[0].thinking == r.content[0].thinking
    # Thinking not asked for: none returned.
    plain = client.messages.create(model="smollm2", max_tokens=20, messages=ASK, **GREEDY)
    assert all(b.type != "thinking" for b in plain.content)


# ---- tools on Qwen2.5-Coder-0.5B (hermes calls) ----

@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    require_model(QWEN)
    srv = start(tmp_path_factory.mktemp("messages_qwen"), model=QWEN)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def qwen_client(qwen):
    return anthropic.Anthropic(base_url=qwen.base_url, api_key="none", max_retries=0)


def check_tool_use(block):
    assert block.type == "tool_use"
    assert block.id.startswith("toolu_") and len(block.id) == 30, block.id
    assert block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER_SCHEMA)


def test_tool_choice_any_and_named(qwen_client):
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        r = qwen_client.messages.create(model="smollm2", max_tokens=60, messages=ASK_WEATHER, tools=[WEATHER],
                                        tool_choice=choice, **GREEDY)
        assert r.stop_reason == "tool_use", r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert len(uses) >= 1
        check_tool_use(uses[0])


def test_tool_choice_none_gives_no_call(qwen_client):
    r = qwen_client.messages.create(model="smollm2", max_tokens=30, messages=ASK_WEATHER, tools=[WEATHER],
                                    tool_choice={"type": "none"}, **GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type == "text" for b in r.content)


def test_streamed_tool_use(qwen_client):
    whole = qwen_client.messages.create(model="smollm2", max_tokens=60, messages=ASK_WEATHER, tools=[WEATHER],
                                        tool_choice={"type": "any"}, **GREEDY)
    with qwen_client.messages.stream(model="smollm2", max_tokens=60, messages=ASK_WEATHER, tools=[WEATHER],
                                     tool_choice={"type": "any"}, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == [b.type for b in whole.content]
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert partial
    assert final.stop_reason == "tool_use"
    use = [b for b in final.content if b.type == "tool_use"][0]
    check_tool_use(use)
    assert use.input == [b for b in whole.content if b.type == "tool_use"][0].input


def test_tool_result_round_trip(qwen, qwen_client):
    first = qwen_client.messages.create(model="smollm2", max_tokens=60, messages=ASK_WEATHER, tools=[WEATHER],
                                        tool_choice={"type": "any", "disable_parallel_tool_use": True}, **GREEDY)
    use = [b for b in first.content if b.type == "tool_use"][0]
    check_tool_use(use)
    result = json.dumps({"temperature_celsius": 18, "sky": "cloudy"})
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": result}]}]},
    ]
    final = qwen_client.messages.create(model="smollm2", max_tokens=40, messages=messages, tools=[WEATHER],
                                        tool_choice={"type": "none"}, **GREEDY)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content and final.content[0].type == "text" and final.content[0].text
    # The same conversation in Chat Completions' shape: the same prompt, and the same greedy answer.
    chat_messages = ASK_WEATHER + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": use.id, "type": "function",
                         "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result},
    ]
    tokens = requests.post(qwen.base_url + "/tokenize", json={"messages": chat_messages},
                           timeout=30).json()["tokens"]
    text = requests.post(qwen.base_url + "/detokenize", json={"tokens": tokens}, timeout=30).json()["prompt"]
    assert "<tool_response>\n" + result + "\n</tool_response>" in text, text
    chat = OpenAI(base_url=qwen.base_url + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="smollm2", messages=chat_messages, tools=[WEATHER_OPENAI], tool_choice="none", max_tokens=40,
        temperature=0)
    assert final.content[0].text == chat.choices[0].message.content
    assert final.usage.input_tokens == chat.usage.prompt_tokens
    assert qwen_client.messages.count_tokens(model="smollm2", messages=messages, tools=[WEATHER],
                                             tool_choice={"type": "none"}).input_tokens == final.usage.input_tokens
