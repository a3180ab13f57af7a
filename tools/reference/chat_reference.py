#!/usr/bin/env python3
"""Reference renderings of chat templates, made with llama.cpp (through
llama-cpp-python), for tests/unit/chat_template_test.cpp.

Each conversation is rendered twice, independently:
  * by llama-cpp-python's Jinja2 formatter (llama_cpp.llama_chat_format.
    Jinja2ChatFormatter), which runs the model's Jinja template the way Hugging
    Face transformers does (trim_blocks, lstrip_blocks, raise_exception, ...);
  * by llama.cpp's C API llama_chat_apply_template, which does not run Jinja at
    all: it recognises the template family (chatml, gemma) and formats the
    conversation with built-in C++ code.
The two must agree (up to the documented differences of the built-in formats,
spelled out below) before the Jinja2 rendering is written out as the expected
prompt.

Outputs (committed):
  tests/data/chat/smollm2_three_turn.json  SmolLM2's template (read from the GGUF
                                           key tokenizer.chat_template) + cases
  tests/data/chat/gemma3_cases.json        cases for tests/data/chat/gemma3.jinja
  tests/data/chat/qwen2.5_cases.json       Qwen2.5's template (tokenizer.chat_template of the
                                           Qwen2.5-Coder GGUF) + cases, among them its default
                                           system prompt for a conversation without one

  tests/data/chat/qwen3.5_cases.json       cases for tests/data/chat/qwen3.5.jinja (Jinja2 only:
                                           llama.cpp has no built-in format for it), thinking
                                           on and off (enable_thinking) and earlier thinking

tests/data/chat/qwen3.5.jinja is llama.cpp's vendored models/templates/Qwen3.5-4B.jinja
(Qwen3.5's tokenizer_config.json template), input to this script like gemma3.jinja.
tests/data/chat/gemma3.jinja is the official Gemma 3 chat template from the
google/gemma-3-*-it tokenizer_config.json ("chat_template"); the Gemma 3 GGUF
on this machine embeds no template. It is input to this script, not output.

Usage: python3 tools/reference/chat_reference.py [--model-dir DIR] [--out DIR] [--only FILE]
"""
import argparse
import ctypes
import json
import os
import sys

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SYSTEM = "You are a concise assistant. Answer in one sentence."
THREE_TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And how many people live there?  "},
]


def with_system(messages):
    return [{"role": "system", "content": SYSTEM}] + messages


def jinja_render(template, messages, bos, eos, add_generation_prompt):
    formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos,
                                    add_generation_prompt=add_generation_prompt)
    return formatter(messages=messages).prompt


def llama_cpp_builtin_render(template, messages, add_generation_prompt):
    """llama.cpp's C++ formatter for the template family it detects."""
    # Keep the encoded strings alive while the C call reads them.
    roles = [m["role"].encode() for m in messages]
    contents = [m["content"].encode() for m in messages]
    chat = (llama_cpp.llama_chat_message * len(messages))()
    for i in range(len(messages)):
        chat[i].role = roles[i]
        chat[i].content = contents[i]
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages),
                                                add_generation_prompt, buf, size)
        if n < 0:
            raise RuntimeError("llama_chat_apply_template did not recognise the template")
        if n <= size:
            return buf.raw[:n].decode()
        size = n


def check_equal(what, got, want):
    if got != want:
        sys.exit(f"MISMATCH in {what}:\n--- llama.cpp C API ---\n{got!r}\n--- Jinja2 ---\n{want!r}")
    print(f"agree: {what}")


def load_vocab(path):
    model = Llama(model_path=path, vocab_only=True, verbose=False)
    bos = model._model.token_get_text(model.token_bos())
    eos = model._model.token_get_text(model.token_eos())
    return model, bos, eos


def smollm2_cases(model_dir):
    path = os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    model, bos, eos = load_vocab(path)
    template = model.metadata["tokenizer.chat_template"]
    # SmolLM2's template inserts this system prompt when the conversation has none.
    default_system = template.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]

    cases = []
    for name, messages, add_gen in [
        ("system_three_turn", with_system(THREE_TURNS), True),
        ("system_three_turn_no_generation_prompt", with_system(THREE_TURNS), False),
        ("no_system_three_turn", THREE_TURNS, True),
    ]:
        expected = jinja_render(template, messages, bos, eos, add_gen)
        # llama.cpp's built-in chatml does not add SmolLM2's default system
        # prompt, so give it explicitly when the conversation has none.
        builtin_messages = messages
        if messages[0]["role"] != "system":
            builtin_messages = [{"role": "system", "content": default_system}] + messages
        check_equal(f"smollm2/{name}",
                    llama_cpp_builtin_render(template, builtin_messages, add_gen), expected)
        cases.append({"name": name, "messages": messages,
                      "add_generation_prompt": add_gen, "expected": expected})
    return {
        "source": "tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf; expected "
                  "renderings by llama-cpp-python Jinja2ChatFormatter, cross-checked "
                  "against llama_chat_apply_template (tools/reference/chat_reference.py)",
        "template": template,
        "bos_token": bos,
        "eos_token": eos,
        "cases": cases,
    }


def gemma3_cases(model_dir, data_dir):
    with open(os.path.join(data_dir, "gemma3.jinja"), encoding="utf-8") as f:
        template = f.read()
    _, bos, eos = load_vocab(os.path.join(model_dir, "gemma-3-270m-q4_k_m.gguf"))

    cases = []
    for name, messages, add_gen in [
        ("system_three_turn", with_system(THREE_TURNS), True),
        ("no_system_three_turn", THREE_TURNS, True),
        ("no_system_three_turn_no_generation_prompt", THREE_TURNS, False),
    ]:
        expected = jinja_render(template, messages, bos, eos, add_gen)
        # llama.cpp's built-in gemma format: same turns, but it writes no BOS
        # (llama.cpp adds that when tokenizing).
        check_equal(f"gemma3/{name}",
                    bos + llama_cpp_builtin_render(template, messages, add_gen), expected)
        cases.append({"name": name, "messages": messages,
                      "add_generation_prompt": add_gen, "expected": expected})

    # The template refuses conversations whose roles do not alternate.
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        jinja_render(template, bad, bos, eos, True)
        sys.exit("gemma3 template accepted two user turns in a row")
    except Exception as e:  # jinja2 raises what raise_exception() was given
        error = str(e)
    return {
        "source": "tests/data/chat/gemma3.jinja (official Gemma 3 template); expected "
                  "renderings by llama-cpp-python Jinja2ChatFormatter, cross-checked "
                  "against llama_chat_apply_template (tools/reference/chat_reference.py)",
        "bos_token": bos,
        "eos_token": eos,
        "cases": cases,
        "error_cases": [{"name": "roles_do_not_alternate", "messages": bad,
                         "add_generation_prompt": True, "error": error}],
    }


QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def qwen25_cases(model_dir):
    path = os.path.join(model_dir, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    model, bos, eos = load_vocab(path)
    template = model.metadata["tokenizer.chat_template"]
    # Qwen2.5's template opens with this system turn when the conversation has none.
    if QWEN_DEFAULT_SYSTEM not in template:
        sys.exit("Qwen2.5's template no longer carries the default system prompt this script expects")

    cases = []
    for name, messages, add_gen in [
        ("system_three_turn", with_system(THREE_TURNS), True),
        ("system_three_turn_no_generation_prompt", with_system(THREE_TURNS), False),
        ("no_system_three_turn", THREE_TURNS, True),
        ("no_system_one_turn_no_generation_prompt", THREE_TURNS[:1], False),
        ("system_later_turn", THREE_TURNS[:2] + [{"role": "system", "content": SYSTEM}] + THREE_TURNS[2:], True),
    ]:
        expected = jinja_render(template, messages, bos, eos, add_gen)
        # llama.cpp's built-in chatml writes the turns as given: no default system prompt.
        builtin_messages = messages
        if messages[0]["role"] != "system":
            builtin_messages = [{"role": "system", "content": QWEN_DEFAULT_SYSTEM}] + messages
        check_equal(f"qwen2.5/{name}",
                    llama_cpp_builtin_render(template, builtin_messages, add_gen), expected)
        cases.append({"name": name, "messages": messages,
                      "add_generation_prompt": add_gen, "expected": expected})
    return {
        "source": "tokenizer.chat_template of qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (the -1.5B "
                  "model's is the same); expected renderings by llama-cpp-python "
                  "Jinja2ChatFormatter, cross-checked against llama_chat_apply_template "
                  "(tools/reference/chat_reference.py)",
        "template": template,
        "bos_token": bos,
        "eos_token": eos,
        "default_system": QWEN_DEFAULT_SYSTEM,
        "cases": cases,
    }


def qwen35_cases(data_dir):
    with open(os.path.join(data_dir, "qwen3.5.jinja"), encoding="utf-8") as f:
        template = f.read()
    bos, eos = "", "<|im_end|>"
    earlier_thinking = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."},
        {"role": "user", "content": "And of Italy?"},
    ]
    cases = []
    for name, messages, add_gen, extra in [
        ("one_turn", THREE_TURNS[:1], True, {}),
        ("system_three_turn", with_system(THREE_TURNS), True, {}),
        ("three_turn_no_generation_prompt", THREE_TURNS, False, {}),
        ("thinking_off", with_system(THREE_TURNS), True, {"enable_thinking": False}),
        ("earlier_thinking_dropped", earlier_thinking, True, {}),
    ]:
        formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos,
                                        add_generation_prompt=add_gen)
        expected = formatter(messages=messages, **extra).prompt
        cases.append({"name": name, "messages": messages, "add_generation_prompt": add_gen,
                      "extra_context": extra, "expected": expected})
    return {
        "source": "tests/data/chat/qwen3.5.jinja (llama.cpp's models/templates/Qwen3.5-4B.jinja); expected "
                  "renderings by llama-cpp-python Jinja2ChatFormatter, extra_context passed as template "
                  "variables (tools/reference/chat_reference.py)",
        "bos_token": bos,
        "eos_token": eos,
        "cases": cases,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.environ.get(
        "INFERD_MODEL_DIR", os.path.expanduser("~/.cache/inferd/models")))
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "chat"))
    parser.add_argument("--only", help="only this output file, e.g. qwen3.5_cases.json")
    args = parser.parse_args()

    makers = {
        "smollm2_three_turn.json": lambda: smollm2_cases(args.model_dir),
        "gemma3_cases.json": lambda: gemma3_cases(args.model_dir, args.out),
        "qwen2.5_cases.json": lambda: qwen25_cases(args.model_dir),
        "qwen3.5_cases.json": lambda: qwen35_cases(args.out),
    }
    outputs = {name: make() for name, make in makers.items() if not args.only or name == args.only}
    for name, data in outputs.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {os.path.join(args.out, name)}")


if __name__ == "__main__":
    main()
