"""Structured outputs through the official `openai` client: JSON schemas
(client.chat.completions.parse with pydantic models, and raw schemas), greedy
and sampled, every output validated with `jsonschema`; json_object; vLLM's
structured_outputs (regex, choice, Lark grammar) and guided_* fields;
llama-server's json_schema and GBNF grammar; 400s that name the problem;
max_tokens ("length"), n = 2, streaming."""
from __future__ import annotations

import concurrent.futures
import enum
import json
import math
import re
from typing import Annotated, Literal, Optional, Union

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

MESSAGES = [{"role": "user", "content": "Fill in the JSON object with plausible example values."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


# ---------------------------------------------------------------------------
# 20 pydantic models (nested objects, arrays with bounds, enums, patterns,
# Optional = anyOf with null, numbers with bounds, defaults)

class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Employee(BaseModel):
    person: Person
    address: Address
    salary: float = Field(ge=0, le=1_000_000)


class Tagged(BaseModel):
    tags: list[str] = Field(min_length=1, max_length=3)


class Scores(BaseModel):
    scores: list[int] = Field(min_length=2, max_length=4)


class Palette(BaseModel):
    primary: Color
    others: list[Color] = Field(max_length=2)


class Status(BaseModel):
    state: Literal["active", "inactive", "banned"]
    reason: Optional[str] = Field(default=None, max_length=20)


class MaybeNumber(BaseModel):
    value: Optional[int] = Field(ge=0, le=1000)


class Flags(BaseModel):
    enabled: bool
    verbose: bool
    level: int = Field(ge=1, le=5)


class Product(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    price: float = Field(gt=0, lt=10000)
    in_stock: bool


class Polygon(BaseModel):
    name: str = Field(max_length=12)
    vertices: list[Point] = Field(min_length=3, max_length=4)


class Matrix(BaseModel):
    rows: list[Annotated[list[Annotated[int, Field(ge=0, le=9)]], Field(min_length=1, max_length=3)]] = Field(
        min_length=1, max_length=2)


class Event(BaseModel):
    title: str = Field(max_length=24)
    date: str = Field(pattern=r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$")
    attendees: list[Person] = Field(max_length=2)


class Shape(BaseModel):
    kind: Literal["circle", "square"]
    size: float = Field(ge=0.5, le=10)


class Drawing(BaseModel):
    shapes: list[Shape] = Field(min_length=1, max_length=3)
    background: Optional[Color]


class Team(BaseModel):
    lead: Person
    members: list[Person] = Field(min_length=1, max_length=2)


class IntOrText(BaseModel):
    item: Union[int, str] = Field(union_mode="left_to_right")
    note: Optional[str] = Field(max_length=10)


class Weather(BaseModel):
    city: str = Field(max_length=16)
    temperature_c: float = Field(ge=-50, le=60)
    condition: Literal["sunny", "cloudy", "rain", "snow"]
    humidity: int = Field(ge=0, le=100)


class Tree(BaseModel):
    label: str = Field(max_length=10)
    children: list["Leaf"] = Field(max_length=2)


class Leaf(BaseModel):
    label: str = Field(max_length=10)
    weight: int = Field(ge=0, le=9)


Tree.model_rebuild()

PYDANTIC_MODELS = [Point, Person, Address, Employee, Tagged, Scores, Palette, Status, MaybeNumber, Flags,
                   Product, Polygon, Matrix, Event, Shape, Drawing, Team, IntOrText, Weather, Tree]

# ---------------------------------------------------------------------------
# 12 raw JSON schemas (what pydantic does not write: const, top-level arrays
# and scalars, oneOf, nested anyOf, numeric enums, pattern keys...)

RAW_SCHEMAS = {
    "top_level_array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                        "minItems": 2, "maxItems": 5},
    "boolean": {"type": "boolean"},
    "bounded_integer": {"type": "integer", "minimum": 10, "maximum": 20},
    "enum_numbers": {"enum": [1, 2, 3.5, "four", None]},
    "const": {"type": "object", "properties": {"version": {"const": "v1"}, "n": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["version", "n"], "additionalProperties": False},
    "one_of": {"oneOf": [{"type": "object", "properties": {"cat": {"type": "string", "maxLength": 8}},
                          "required": ["cat"], "additionalProperties": False},
                         {"type": "object", "properties": {"dog": {"type": "integer", "minimum": 0, "maximum": 9}},
                          "required": ["dog"], "additionalProperties": False}]},
    "nullable_nested": {"type": "object", "properties": {
        "owner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10}}, "required": ["name"], "additionalProperties": False}]}},
        "required": ["owner"], "additionalProperties": False},
    "string_formats": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[a-f0-9]{4}$"},
        "word": {"type": "string", "minLength": 2, "maxLength": 6, "pattern": "^[a-z]+$"}},
        "required": ["code", "word"], "additionalProperties": False},
    "array_of_arrays": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"},
                        "minItems": 1, "maxItems": 2}, "minItems": 1, "maxItems": 2},
    "optional_fields": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 5},
        "b": {"type": "string", "maxLength": 5}, "c": {"type": "boolean"}},
        "required": ["a"], "additionalProperties": False},
    "number_bounds": {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "neg": {"type": "integer", "exclusiveMaximum": 0, "minimum": -50}},
        "required": ["ratio", "neg"], "additionalProperties": False},
    "refs": {"$defs": {"pair": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                "minItems": 2, "maxItems": 2}},
             "type": "object", "properties": {"first": {"$ref": "#/$defs/pair"}, "second": {"$ref": "#/$defs/pair"}},
             "required": ["first", "second"], "additionalProperties": False},
}

assert len(PYDANTIC_MODELS) + len(RAW_SCHEMAS) >= 30


def sampling(mode: str, i: int) -> dict:
    if mode == "greedy":
        return {"temperature": 0}
    return {"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i}


def run_all(jobs):
    """Runs the calls concurrently (the engine batches them); returns results or exceptions."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(job) for job in jobs]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 -- reported below with the schema's name
                out.append(e)
        return out


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_pydantic_models_parse_and_validate(client, server, mode):
    def job(i, model):
        def call():
            return client.chat.completions.parse(model=server.model, messages=MESSAGES, response_format=model,
                                                 max_tokens=400, **sampling(mode, i))
        return call

    results = run_all([job(i, m) for i, m in enumerate(PYDANTIC_MODELS)])
    failures = []
    for model, r in zip(PYDANTIC_MODELS, results):
        if isinstance(r, Exception):
            failures.append(f"{model.__name__}: {type(r).__name__}: {r}")
            continue
        choice = r.choices[0]
        if choice.finish_reason != "stop" or choice.message.parsed is None:
            failures.append(f"{model.__name__}: finish {choice.finish_reason}, content {choice.message.content!r}")
            continue
        assert isinstance(choice.message.parsed, model)
        try:
            jsonschema.validate(json.loads(choice.message.content), model.model_json_schema())
        except jsonschema.ValidationError as e:
            failures.append(f"{model.__name__}: {e.message}: {choice.message.content!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_raw_json_schemas_validate(client, server, mode):
    names = list(RAW_SCHEMAS)

    def job(i, name):
        def call():
            return client.chat.completions.create(
                model=server.model, messages=MESSAGES, max_tokens=300, **sampling(mode, i),
                response_format={"type": "json_schema",
                                 "json_schema": {"name": name, "schema": RAW_SCHEMAS[name], "strict": True}})
        return call

    check_schema_answers(names, run_all([job(i, n) for i, n in enumerate(names)]))


def check_schema_answers(names, results):
    """Each answer (or exception) to RAW_SCHEMAS[name] finished by its grammar and validates."""
    failures = []
    for name, r in zip(names, results):
        if isinstance(r, Exception):
            failures.append(f"{name}: {type(r).__name__}: {r}")
            continue
        choice = r.choices[0]
        try:
            assert choice.finish_reason == "stop", choice.finish_reason
            jsonschema.validate(json.loads(choice.message.content), RAW_SCHEMAS[name])
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{name}: {e}: {choice.message.content!r}")
    assert not failures, "\n".join(failures)


def test_json_object_is_a_json_object(client, server):
    # Any object: a small model asked for a big one may list items until
    # max_tokens, so ask for a small one.
    ask = [{"role": "user", "content": 'What is 2+2? Reply with a JSON object with one key, "answer".'}]
    r = client.chat.completions.create(model=server.model, messages=ask, max_tokens=100, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_completions_endpoint_takes_response_format(client, server):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}},
              "required": ["answer"], "additionalProperties": False}
    r = client.completions.create(model=server.model, prompt="Two plus two, as JSON:", max_tokens=40, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "a", "schema": schema}}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_regex_and_choice_through_structured_outputs(client, server):
    r = client.chat.completions.create(
        model=server.model, max_tokens=30, temperature=0.8, seed=3,
        messages=[{"role": "user", "content": "Give me a US phone number."}],
        extra_body={"structured_outputs": {"regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"}})
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", r.choices[0].message.content)

    choices = ["positive", "negative", "neutral"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        r = client.chat.completions.create(
            model=server.model, max_tokens=10, temperature=0,
            messages=[{"role": "user", "content": "Sentiment of: 'I love this product!'"}], extra_body=extra)
        assert r.choices[0].message.content in choices
        assert r.choices[0].finish_reason == "stop"


def test_lark_grammar_through_structured_outputs(client, server):
    lark = 'start: "SELECT " column " FROM " table\ncolumn: "name" | "age" | "*"\ntable: /[a-z]{2,10}/\n'
    r = client.completions.create(model=server.model, prompt="An SQL query:", max_tokens=30, temperature=0,
                                  extra_body={"structured_outputs": {"grammar": lark}})
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"SELECT (name|age|\*) FROM [a-z]{2,10}", r.choices[0].text), r.choices[0].text


def test_llama_server_gbnf_grammar_and_json_schema(server):
    gbnf = r'''root ::= "Answer: " ("yes" | "no") ", because " reason "."
reason ::= [a-z ]{3,30}
'''
    r = requests.post(server.base_url + "/v1/completions", timeout=60,
                      json={"prompt": "Is water wet?", "max_tokens": 40, "temperature": 0, "grammar": gbnf}).json()
    text = r["choices"][0]["text"]
    assert r["choices"][0]["finish_reason"] == "stop", r
    assert re.fullmatch(r"Answer: (yes|no), because [a-z ]{3,30}\.", text), text

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=60,
                      json={"messages": MESSAGES, "max_tokens": 30, "temperature": 0, "json_schema": schema}).json()
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "strin"),
    ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex", "unclosed character class"),
    ({"grammar": "root ::= missing"}, "grammar", "rule 'missing' is not defined"),
    ({"structured_outputs": {"grammar": "start: (\"a\""}}, "structured_outputs.grammar", "lark"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex", "only one structured output"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'yaml'"),
])
def test_invalid_constraints_are_400s_naming_the_problem(client, server, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=5, extra_body=extra)
    err = e.value.body
    assert e.value.status_code == 400
    assert words in err["message"], err
    assert err["param"] == param


def test_max_tokens_cutting_a_schema_finishes_with_length(client, server):
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=5, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "e", "schema": Employee.model_json_schema()}})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.choices[0].message.content.startswith("{")
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=server.model, messages=MESSAGES, max_tokens=5, temperature=0,
                                      response_format=Employee)


def test_n_choices_each_follow_the_schema(client, server):
    r = client.chat.completions.parse(model=server.model, messages=MESSAGES, response_format=Weather, n=2,
                                      temperature=1.0, seed=7, max_tokens=200)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop"
        assert isinstance(c.message.parsed, Weather)
        jsonschema.validate(json.loads(c.message.content), Weather.model_json_schema())
    assert r.choices[0].message.content != r.choices[1].message.content


def test_streaming_with_a_schema_joins_into_a_valid_document(client, server):
    schema = Team.model_json_schema()
    stream = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=300, temperature=0.7, seed=11, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "team", "schema": schema}})
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert len(parts) > 3
    jsonschema.validate(json.loads("".join(parts)), schema)


def test_logprobs_with_a_choice_list_only_name_allowed_tokens(client, server):
    r = client.chat.completions.create(
        model=server.model, max_tokens=10, temperature=0, logprobs=True, top_logprobs=5,
        messages=[{"role": "user", "content": "Pick a color."}],
        extra_body={"structured_outputs": {"choice": ["crimson", "cyan"]}})
    content = r.choices[0].message.content
    assert content in ("crimson", "cyan")
    lps = r.choices[0].logprobs.content
    assert "".join(t.token for t in lps) == content
    # Every alternative shown keeps the text a prefix of one of the choices:
    # disallowed tokens are not part of the (constrained) distribution.
    prefix = ""
    for t in lps:
        total = 0.0
        for alt in t.top_logprobs:
            assert any(c.startswith(prefix + alt.token) for c in ("crimson", "cyan")), (prefix, alt.token)
            total += math.exp(alt.logprob)
        assert total <= 1.0 + 1e-5
        prefix += t.token


def test_one_schema_is_compiled_once_for_many_requests(client, server):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "unique_to_this_test": {"const": 1}},
              "required": ["n", "unique_to_this_test"], "additionalProperties": False}
    compiles = server.metric("inferd:structured_output_compiles_total")
    hits = server.metric("inferd:structured_output_compile_cache_hits_total")

    def call():
        return client.chat.completions.create(
            model=server.model, messages=MESSAGES, max_tokens=40, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})

    results = run_all([call] * 24)
    for r in results:
        assert not isinstance(r, Exception), r
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert server.metric("inferd:structured_output_compiles_total") == compiles + 1
    assert server.metric("inferd:structured_output_compile_cache_hits_total") == hits + 23
    # A bad schema is refused each time, compiled (and counted as failed) once.
    failures = server.metric("inferd:structured_output_compile_failures_total")
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=5,
                                           extra_body={"guided_json": {"type": "no-such-type"}})
    assert server.metric("inferd:structured_output_compile_failures_total") == failures + 1
