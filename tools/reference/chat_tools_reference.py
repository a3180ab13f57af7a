#!/usr/bin/env python3
"""Reference renderings of conversations with tools, for
tests/unit/server_tool_calling_test.cpp.

Each case is an OpenAI chat request (its `messages` and `tools`); the expected
prompt is what Hugging Face transformers' apply_chat_template makes of it with
Qwen2.5's chat template: the template run by Jinja2 in the environment
transformers builds (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
the loopcontrols extension, tojson as json.dumps(ensure_ascii=False),
raise_exception), given `tools` as the request's list and each assistant tool
call's `function.arguments` as the object its JSON string holds (what vLLM
hands the template). inferd must produce the same text from the request
through its own protocol parser and minijinja renderer.

The template is read from tests/data/chat/qwen2.5_cases.json ("template", the
tokenizer.chat_template of the Qwen2.5-Coder GGUF), so no model is needed.

Output (committed): tests/data/chat/qwen2.5_tools_cases.json

Usage: python3 tools/reference/chat_tools_reference.py
"""
import copy
import json
import os

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "data", "chat")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone (é, 東京).",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "ping"}}

USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"}

CASES = [
    ("tools_user", [USER], [WEATHER, TIME], True),
    ("tools_system_user", [{"role": "system", "content": "You are terse."}, USER], [WEATHER], True),
    ("tools_no_params", [USER], [NO_PARAMS], True),
    ("round_trip", [USER, CALL, RESULT], [WEATHER, TIME], True),
    ("two_calls_two_results", [
        {"role": "user", "content": "Weather in Paris and time in Tokyo?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{\"zone\": \"Asia/Tokyo\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "b", "content": "21:00"},
    ], [WEATHER, TIME], True),
    ("arguments_not_json", [USER, {"role": "assistant", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "Paris, please"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "sunny"}], [WEATHER], False),
    ("no_tools_with_history", [USER, CALL, RESULT], None, True),
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise RuntimeError(message)


def template_messages(messages):
    """The messages as the template gets them: arguments strings parsed."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            args = call["function"].get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        if m.get("content") is None and "tool_calls" in m:
            m["content"] = ""
    return out


def main():
    with open(os.path.join(DATA, "qwen2.5_cases.json")) as f:
        base = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(base["template"])
    cases = []
    for name, messages, tools, add_gen in CASES:
        context = {"messages": template_messages(messages), "add_generation_prompt": add_gen,
                   "bos_token": base["bos_token"], "eos_token": base["eos_token"]}
        if tools is not None:
            context["tools"] = tools
        request = {"messages": messages}
        if tools is not None:
            request["tools"] = tools
        if not add_gen:
            request["add_generation_prompt"] = False
        cases.append({"name": name, "request": request, "expected": template.render(**context)})
    out = {
        "source": "Qwen2.5's tokenizer.chat_template (tests/data/chat/qwen2.5_cases.json); expected renderings "
                  "by Jinja2 in Hugging Face transformers' chat-template environment "
                  "(tools/reference/chat_tools_reference.py)",
        "cases": cases,
    }
    path = os.path.join(DATA, "qwen2.5_tools_cases.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
