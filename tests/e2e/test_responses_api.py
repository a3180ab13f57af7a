"""OpenAI's Responses API (/v1/responses) through the official openai client:
client.responses.create and client.responses.stream (the semantic events in
their order, sequence numbers counting up, the deltas adding up to the final
text); the same answer as Chat Completions gives for the same conversation
(greedy, so the prompts must match token for token); previous_response_id
continuing a stored conversation; GET and DELETE of stored responses; JSON
schema output validated with jsonschema; a whole tool round trip on
Qwen2.5-Coder-0.5B (call, function_call_output in `input`, answer; also
streamed, and continued through previous_response_id); reasoning items from
the qwen3 reasoning parser; and the bad requests, each in OpenAI's error shape.
The Qwen cases skip when the model file is absent.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from openai import BadRequestError, NotFoundError, OpenAI

from conftest import MODEL_NAME, start, stop, tool_schemas, weather_tool
from test_reasoning import CITY, FEW_SHOT  # a few-shot conversation that teaches the model to think first
from test_tool_calls import QWEN, qwen  # noqa: F401 (the fixture: Qwen2.5-Coder-0.5B as the tool tests serve it)

ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
ANSWER_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}

WEATHER_CHAT = weather_tool({"city": {"type": "string", "description": "The city, e.g. Paris"}})
WEATHER = {"type": "function", **WEATHER_CHAT["function"]}  # Responses' flat function tool
SCHEMAS = tool_schemas(WEATHER_CHAT)
ASK_WEATHER = "What is the weather like in Paris right now?"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def chat_answer(client, messages, **kwargs):
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, **kwargs)


def event_types(events):
    return [e.type for e in events]


# ---- the default model ----------------------------------------------------------------


def test_create_gives_the_chat_answer(client):
    r = client.responses.create(model=MODEL_NAME, input="Name a fruit.", instructions="Answer in one word.",
                                max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r
    assert r.model == MODEL_NAME and r.instructions == "Answer in one word."
    assert [item.type for item in r.output] == ["message"], r.output
    message = r.output[0]
    assert message.role == "assistant" and message.id.startswith("msg_")
    assert [part.type for part in message.content] == ["output_text"]
    # Greedy: the same conversation through Chat Completions gives the same tokens.
    chat = chat_answer(client, [{"role": "system", "content": "Answer in one word."},
                                {"role": "user", "content": "Name a fruit."}], max_tokens=12)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert (r.status == "incomplete") == (chat.choices[0].finish_reason == "length")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_stream_events_in_order(client):
    events = list(client.responses.create(model=MODEL_NAME, input="Is the sky blue?", text=ANSWER_FORMAT,
                                          max_output_tokens=40, temperature=0, stream=True))
    types = event_types(events)
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], types
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas), types
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.completed"], types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(d.delta for d in deltas)
    assert events[types.index("response.output_text.done")].text == text
    final = events[-1].response
    assert final.status == "completed" and final.id == events[0].response.id
    assert final.output_text == text
    assert final.output[0].id == deltas[0].item_id == events[-2].item.id
    jsonschema.validate(json.loads(text), ANSWER)
    # The same request whole gives the same text.
    whole = client.responses.create(model=MODEL_NAME, input="Is the sky blue?", text=ANSWER_FORMAT,
                                    max_output_tokens=40, temperature=0)
    assert whole.output_text == text


def test_stream_helper_final_response(client):
    with client.responses.stream(model=MODEL_NAME, input="Is water wet?", text=ANSWER_FORMAT,
                                 max_output_tokens=40, temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_text == text
    jsonschema.validate(json.loads(text), ANSWER)


def test_json_object_format(client):
    r = client.responses.create(model=MODEL_NAME, input="Give a JSON object with a key 'x'.",
                                text={"format": {"type": "json_object"}}, max_output_tokens=30, temperature=0)
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict), r.output_text
    else:  # cut by max_output_tokens: still a JSON object's start
        assert r.output_text.lstrip().startswith("{"), r.output_text


def test_previous_response_id_continues_the_conversation(client, server):
    first = client.responses.create(model=MODEL_NAME, input="My name is Ada.", instructions="Be brief.",
                                    max_output_tokens=10, temperature=0)
    second = client.responses.create(model=MODEL_NAME, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=10, temperature=0)
    assert second.previous_response_id == first.id
    # The earlier input and output items come first; the instructions are not carried over.
    messages = [{"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "What is my name?"}]
    chat = chat_answer(client, messages, max_tokens=10)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    tokens = requests.post(server.base_url + "/tokenize", json={"messages": messages}, timeout=30).json()
    assert second.usage.input_tokens == tokens["count"]
    # A chain: the third sees both earlier turns.
    third = client.responses.create(model=MODEL_NAME, previous_response_id=second.id, input="Thanks.",
                                    max_output_tokens=4, temperature=0)
    messages += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "Thanks."}]
    assert third.usage.input_tokens == chat_answer(client, messages, max_tokens=4).usage.prompt_tokens


def test_stored_responses_get_and_delete(client):
    r = client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=4, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    client.responses.delete(r.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(NotFoundError) as e:  # a deleted response cannot be continued
        client.responses.create(model=MODEL_NAME, previous_response_id=r.id, input="Hi", max_output_tokens=2)
    assert e.value.body["code"] == "previous_response_not_found"
    unstored = client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(NotFoundError):
        client.responses.retrieve(unstored.id)
    # A streamed response is stored too, as its final event says.
    events = list(client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=4, stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == final.output_text


def check_error(resp, status, param=None, contains=None, code=None):
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text}"
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param, err
    if contains is not None:
        assert contains in err["message"], err
    if code is not None:
        assert err["code"] == code, err
    return err


BAD = [
    ("no input", {"model": MODEL_NAME}, 400, "input", "'input' is required"),
    ("empty input list", {"input": []}, 400, "input", "empty"),
    ("unknown item type", {"input": [{"type": "computer_call", "id": "x"}]}, 400, "input", "'computer_call'"),
    ("unknown content part", {"input": [{"role": "user", "content": [{"type": "input_video"}]}]}, 400, "input",
     "input_video"),
    ("image input", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input", "text only"),
    ("output without call", {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, 400,
     "input", "call_9"),
    ("unknown tool_choice", {"input": "x", "tool_choice": "always"}, 400, "tool_choice", "'always'"),
    ("unknown tool type", {"input": "x", "tools": [{"type": "teleport"}]}, 400, "tools", "'teleport'"),
    ("non-function tool in a namespace", {"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [
        {"type": "web_search"}]}]}, 400, "tools", "function tools only"),
    ("background", {"input": "x", "background": True}, 400, "background", "not supported"),
    ("bad text.format", {"input": "x", "text": {"format": {"type": "xml"}}}, 400, "text.format", "'xml'"),
    ("max_output_tokens zero", {"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", None),
    ("temperature out of range", {"input": "x", "temperature": 3}, 400, "temperature", None),
    ("unknown model", {"input": "x", "model": "gpt-9"}, 404, None, "gpt-9"),
    ("unknown previous response", {"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id",
     "resp_nope"),
]


def test_hosted_tools_left_out(server, client):
    """A hosted tool as Codex offers it (web_search): this server runs none, so
    it is left out, said once in the log, and the request is answered.
    (SmolLM2's template takes no tools; namespaces of function tools are in
    the unit test and test_codex_cli.py.)"""
    for _ in range(2):
        r = client.responses.create(model=MODEL_NAME, input="Say hi.", max_output_tokens=4, temperature=0,
                                    tools=[{"type": "web_search", "external_web_access": False}])
        assert r.status in ("completed", "incomplete") and r.output[0].type == "message", r
    assert server.log().count("'web_search' tools are left out") == 1, server.log()[-3000:]


@pytest.mark.parametrize("name,body,status,param,contains", BAD, ids=[c[0] for c in BAD])
def test_bad_requests(server, name, body, status, param, contains):
    r = requests.post(server.base_url + "/v1/responses", json=body, timeout=30)
    check_error(r, status, param, contains)
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200


def test_bad_routes(server):
    check_error(requests.get(server.base_url + "/v1/responses/resp_nope", timeout=10), 404, contains="resp_nope")
    check_error(requests.delete(server.base_url + "/v1/responses/resp_nope", timeout=10), 404)
    check_error(requests.get(server.base_url + "/v1/responses", timeout=10), 405)
    check_error(requests.put(server.base_url + "/v1/responses/resp_x", timeout=10), 405)
    check_error(requests.post(server.base_url + "/v1/responses", data=b"{", timeout=10,
                              headers={"Content-Type": "application/json"}), 400)
    # The client's own errors: BadRequestError with the message.
    client = OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(BadRequestError, match="empty"):
        client.responses.create(model=MODEL_NAME, input=[])


# ---- tools on Qwen2.5-Coder-0.5B ------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_client(qwen):
    return OpenAI(base_url=qwen.base_url + "/v1", api_key="none", max_retries=0)


def check_call(item):
    assert item.type == "function_call" and item.id.startswith("fc_"), item
    assert item.call_id.startswith("call_") and item.name == "get_weather", item
    args = json.loads(item.arguments)
    jsonschema.validate(args, SCHEMAS["get_weather"])
    return args


def test_tool_round_trip(qwen_client):
    first = qwen_client.responses.create(model=MODEL_NAME, input=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                         parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    assert first.status == "completed", first
    assert [item.type for item in first.output] == ["function_call"], first.output
    call = first.output[0]
    check_call(call)
    result = json.dumps({"temperature_celsius": 18, "sky": "cloudy"})
    # The call and its output go back in `input` (the output items as returned).
    items = [{"role": "user", "content": ASK_WEATHER}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    final = qwen_client.responses.create(model=MODEL_NAME, input=items, tools=[WEATHER], tool_choice="none",
                                         max_output_tokens=40, temperature=0)
    assert [item.type for item in final.output] == ["message"], final.output
    assert final.output_text
    # Chat Completions on the same conversation: the same prompt, the same answer.
    messages = [{"role": "user", "content": ASK_WEATHER},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call.call_id, "type": "function",
                                 "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": result}]
    chat = qwen_client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER_CHAT],
                                               tool_choice="none", max_tokens=40, temperature=0)
    assert final.output_text == chat.choices[0].message.content
    assert final.usage.input_tokens == chat.usage.prompt_tokens
    # The same through previous_response_id: only the output goes in `input`.
    continued = qwen_client.responses.create(
        model=MODEL_NAME, previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
        max_output_tokens=40, temperature=0)
    assert continued.output_text == final.output_text
    assert continued.usage.input_tokens == final.usage.input_tokens


def test_streamed_tool_call(qwen_client):
    with qwen_client.responses.stream(model=MODEL_NAME, input=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                      parallel_tool_calls=False, max_output_tokens=60, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = event_types(events)
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"], types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done, item_done = events[2], events[3], events[4], events[5]
    assert added.item.type == "function_call" and added.item.arguments == ""
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert done.arguments == delta.delta == item_done.item.arguments
    args = check_call(item_done.item)
    assert [item.type for item in final.output] == ["function_call"]
    assert json.loads(final.output[0].arguments) == args
    # Whole, the same call.
    whole = qwen_client.responses.create(model=MODEL_NAME, input=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                         parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    assert json.loads(whole.output[0].arguments) == args


def test_named_tool_choice(qwen_client):
    r = qwen_client.responses.create(model=MODEL_NAME, input="Hello!", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     max_output_tokens=60, temperature=0)
    assert [item.type for item in r.output] == ["function_call"], r.output
    check_call(r.output[0])


# ---- reasoning on Qwen2.5-Coder-0.5B with the qwen3 parser ------------------------------

@pytest.fixture(scope="module")
def thinking_client(tmp_path_factory):
    if not QWEN.exists():
        pytest.skip(f"{QWEN} is missing (scripts/fetch_models.sh --all)")
    srv = start(tmp_path_factory.mktemp("qwen_responses_reasoning"), ["--reasoning-parser", "qwen3"], model=QWEN)
    yield OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
    assert stop(srv) == 0, srv.log()[-4000:]


def test_reasoning_items(thinking_client):
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    r = thinking_client.responses.create(model=MODEL_NAME, input=FEW_SHOT, text=fmt, reasoning={"effort": "low"},
                                         max_output_tokens=80, temperature=0)
    assert r.status == "completed", r
    assert [item.type for item in r.output] == ["reasoning", "message"], r.output
    reasoning = r.output[0]
    assert reasoning.id.startswith("rs_")
    thought = "".join(part.text for part in reasoning.content)
    assert "Madrid" in thought and "<think>" not in thought and "</think>" not in thought, thought
    jsonschema.validate(json.loads(r.output_text), CITY)
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    # Streamed: the reasoning events first, then the message's, the same texts.
    events = list(thinking_client.responses.create(model=MODEL_NAME, input=FEW_SHOT, text=fmt, max_output_tokens=80,
                                                   temperature=0, stream=True))
    types = event_types(events)
    first_text = types.index("response.output_text.delta")
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert "response.reasoning_text.delta" in types[:first_text]
    assert "response.reasoning_text.delta" not in types[first_text:]
    assert types.index("response.reasoning_text.done") < types.index("response.output_item.done") < first_text
    streamed_thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed_thought == thought
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == r.output_text
    # The reasoning item goes back as input: its text reaches the template as the assistant's thinking.
    follow = thinking_client.responses.create(model=MODEL_NAME, previous_response_id=r.id, input="City: Rome",
                                              text=fmt, max_output_tokens=80, temperature=0)
    assert follow.status == "completed"
    jsonschema.validate(json.loads(follow.output_text), CITY)
