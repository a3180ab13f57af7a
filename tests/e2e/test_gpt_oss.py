"""gpt-oss's harmony format end to end through the official openai client, on
the tiny random-weight gpt-oss (tests/data/models/tiny-gpt-oss.gguf: the real
o200k_harmony tokenizer, gpt-oss chat template and MXFP4 experts), and
on the tiny random Qwen3 given gpt-oss's template (tests/data/chat/gpt_oss.jinja)
with --chat-template, where the markers are plain text: the same server path
(parser, grammars, streaming) either way. The server picks harmony from the
template (<|channel|>) for reasoning and tool calls alike.

The weights are random, so only what a grammar forces is checked. The
grammars let analysis (and, before a call, commentary) messages through and
constrain only the final message or the call; a random model that enters the
analysis channel rarely writes <|end|>, so such a choice runs to max_tokens.
Each test therefore samples several choices (seeded, so the run is
repeatable) and checks every one: a choice that ended is a valid call (or
valid JSON content), one cut by max_tokens is all reasoning with no content;
at least one choice must have ended. In all of them no harmony marker reaches
the client. Skips when the model file is absent.
"""
from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest
from openai import OpenAI

from conftest import REPO, ZONE_ENUM, function_tool, start, stop, tool_schemas, weather_tool

TINY_GPT_OSS = REPO / "tests/data/models/tiny-gpt-oss.gguf"
TINY_QWEN3 = REPO / "tests/data/models/tiny-qwen3.gguf"
GPT_OSS_TEMPLATE = REPO / "tests/data/chat/gpt_oss.jinja"
MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>")

WEATHER = weather_tool()
# gpt-oss's template fails on a tool without a description.
TIME = function_tool("get_time", {"zone": ZONE_ENUM}, ["zone"], "Get the time in a zone.", closed=True)
SCHEMAS = tool_schemas(WEATHER, TIME)
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
          "required": ["ok", "level"], "additionalProperties": False}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
N = 8
COMMON = dict(model="smollm2", messages=ASK, temperature=1.0, seed=1, n=N, max_tokens=60)


# The template writes today's date into the system message; a random-weight
# model's seeded choices change with any prompt token, so the tests render a
# copy with the date fixed (the day the expectations below were drawn) and
# give the same choices every day.
FIXED_DATE = "2026-11-28"


def fixed_date_template(directory: pathlib.Path) -> pathlib.Path:
    text = GPT_OSS_TEMPLATE.read_text()
    assert 'strftime_now("%Y-%m-%d")' in text
    path = directory / "gpt_oss_fixed_date.jinja"
    path.write_text(text.replace('strftime_now("%Y-%m-%d")', f'"{FIXED_DATE}"'))
    return path


@pytest.fixture(scope="module", params=["tiny-gpt-oss", "tiny-qwen3+gpt-oss-template"])
def gpt_oss(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_gpt_oss" if request.param == "tiny-gpt-oss" else "tiny_qwen3_harmony")
    template = ["--chat-template", str(fixed_date_template(directory))]
    if request.param == "tiny-gpt-oss":
        srv = start(directory, template, model=TINY_GPT_OSS)
    else:
        srv = start(directory, template, model=TINY_QWEN3)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def client(gpt_oss):
    return OpenAI(base_url=gpt_oss.base_url + "/v1", api_key="none", max_retries=0)


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def no_markers(*texts):
    for text in texts:
        for marker in MARKERS:
            assert marker not in (text or ""), (marker, text)


def streamed(client, **kwargs):
    """Per choice index: reasoning, content, finish_reason and calls [(name, arguments)]."""
    out: dict[int, dict] = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            c = out.setdefault(choice.index, {"reasoning": "", "content": "", "finish": None, "calls": {}})
            delta = choice.delta
            r = (delta.model_extra or {}).get("reasoning_content")
            if r:
                assert not c["content"].strip() and not c["calls"], "reasoning after the answer"
                c["reasoning"] += r
            c["content"] += delta.content or ""
            for tc in delta.tool_calls or []:
                if tc.index not in c["calls"]:
                    assert tc.id and tc.id.startswith("call_") and tc.function.name, tc
                    c["calls"][tc.index] = [tc.function.name, ""]
                c["calls"][tc.index][1] += tc.function.arguments or ""
            c["finish"] = choice.finish_reason or c["finish"]
    for c in out.values():
        c["calls"] = [tuple(c["calls"][i]) for i in sorted(c["calls"])]
    return out


def check_call_choices(choices, names=tuple(SCHEMAS)):
    """choices: (reasoning, content, finish, calls). A finished choice is one valid call and no content;
    a cut one is reasoning only. At least one called."""
    called = 0
    for reasoning, content, finish, calls in choices:
        no_markers(reasoning, content, *[a for _, a in calls])
        if finish == "tool_calls":
            called += 1
            assert len(calls) == 1, calls
            name, arguments = calls[0]
            assert name in names, name
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        else:
            assert finish == "length", (finish, reasoning, content, calls)
            assert not calls
    assert called >= 1, choices


def test_format_comes_from_the_template(gpt_oss):
    log = gpt_oss.log()
    assert "reasoning: harmony parser (the chat template writes <|channel|>)" in log, log[-3000:]
    assert "tool calling: openai format (from the chat template)" in log, log[-3000:]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_call_whole(client, tool_choice):
    r = client.chat.completions.create(tools=[WEATHER, TIME], tool_choice=tool_choice, **COMMON)
    assert len(r.choices) == N
    choices = []
    for c in r.choices:
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        choices.append((reasoning_of(c.message), c.message.content, c.finish_reason, calls))
        if c.finish_reason == "tool_calls":
            assert c.message.content is None, c.message.content
    names = ("get_time",) if isinstance(tool_choice, dict) else tuple(SCHEMAS)
    check_call_choices(choices, names)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_streamed_matches_the_whole_response(client, tool_choice):
    kwargs = dict(tools=[WEATHER, TIME], tool_choice=tool_choice, **COMMON)
    out = streamed(client, **kwargs)
    assert sorted(out) == list(range(N))
    check_call_choices([(c["reasoning"], c["content"], c["finish"], c["calls"]) for c in out.values()])
    whole = client.chat.completions.create(**kwargs)
    for c in whole.choices:
        s = out[c.index]
        assert s["finish"] == c.finish_reason
        # The whole response's reasoning is trimmed; the stream's deltas are as written.
        assert s["reasoning"].strip() == (reasoning_of(c.message) or "")
        assert [(n, json.loads(a)) for n, a in s["calls"]] == \
            [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]


def test_json_schema_applies_to_the_final_channel(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for stream in (False, True):
        # Two or three in sixteen of the tiny Qwen3's choices skip the analysis.
        kwargs = dict(response_format=fmt, reasoning_effort="low", **{**COMMON, "n": 2 * N})
        if stream:
            choices = [(c["reasoning"], c["content"], c["finish"]) for c in streamed(client, **kwargs).values()]
        else:
            r = client.chat.completions.create(**kwargs)
            choices = [(reasoning_of(c.message), c.message.content, c.finish_reason) for c in r.choices]
        answered = 0
        for reasoning, content, finish in choices:
            no_markers(reasoning, content)
            if finish == "stop":
                answered += 1
                jsonschema.validate(json.loads(content), ANSWER)
            else:
                # Cut inside the analysis: all of it is reasoning, split off.
                assert finish == "length" and reasoning and not content, (finish, reasoning, content)
        assert answered >= 1, choices


def test_tool_history_and_reasoning_render(client):
    messages = ASK + [
        {"role": "assistant", "content": None, "reasoning_content": "Call the weather tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    r = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=8,
                                       temperature=0, reasoning_effort="high")
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    no_markers(reasoning_of(c.message), c.message.content)
