"""Embeddings and reranking end to end: `inferd serve` on all-MiniLM-L6-v2 (the GGUF
scripts/fetch_models.sh --all converts) answers the official openai client's
`client.embeddings.create` with vectors within cosine 0.9999 of the model's own Hugging Face
implementation (tests/data/embeddings, tools/reference/embedding_reference.py), the same for
an input in a batch of 256 as alone; on the tiny random-weight reranker
(tests/data/models/tiny-bert-reranker.gguf) /v1/rerank scores as llama.cpp does
(tests/data/rerank, tools/reference/rerank_reference.py); bad input gets OpenAI's error shape.
A decoder embedding model (tests/data/models/tiny-qwen3-embed-last.gguf: qwen3 with
last-token pooling, as Qwen3-Embedding) gives llama.cpp's vectors, L2-normalized
(tests/data/embeddings, tools/reference/decoder_embedding_reference.py), and refuses to generate.
"""
from __future__ import annotations

import base64
import json
import math
import struct

import openai
import pytest
import requests

from conftest import MODEL_DIR, MODEL_NAME, REPO, start, stop

MINILM = MODEL_DIR / "all-MiniLM-L6-v2.f16.gguf"
RERANKER = REPO / "tests" / "data" / "models" / "tiny-bert-reranker.gguf"
EXPECTED = [json.loads(line) for line in
            (REPO / "tests" / "data" / "embeddings" / "all-minilm-l6-v2.expected.jsonl").read_text().splitlines()]
# Every reference with a vector, less the empty string (which the API refuses, as OpenAI's does).
WITH_VECTORS = [e for e in EXPECTED if "embedding" in e and e["text"]]
QWEN3_EMBED = REPO / "tests" / "data" / "models" / "tiny-qwen3-embed-last.gguf"
QWEN3_EXPECTED = json.loads((REPO / "tests" / "data" / "embeddings" / "tiny-qwen3-embed-last.expected.json")
                            .read_text())["sentences"]
RERANK = json.loads((REPO / "tests" / "data" / "rerank" / "tiny-bert-reranker.expected.json").read_text())["pairs"]


def serve(tmp_path_factory, model, *extra: str):
    return start(tmp_path_factory.mktemp("embed"), ["--max-num-batched-tokens", "2048", *extra],
                 model=model)


# The servers checked against llama.cpp's numbers ask for its arithmetic by name, whatever the
# default: the fast tier moves them by its activation rounding (a cosine of 0.99985, rerank scores
# by 0.02). MiniLM, checked against Hugging Face within a cosine of 0.9999, runs the default.
EXACT = ("--numerics", "exact")


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    srv = serve(tmp_path_factory, MINILM)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory):
    srv = serve(tmp_path_factory, RERANKER, *EXACT)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


@pytest.fixture(scope="module")
def decoder_embed_server(tmp_path_factory):
    srv = serve(tmp_path_factory, QWEN3_EMBED, *EXACT)
    yield srv
    assert stop(srv) == 0, srv.log()[-4000:]


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_match_hugging_face(embed_server):
    texts = [e["text"] for e in WITH_VECTORS]
    resp = client(embed_server).embeddings.create(model=MODEL_NAME, input=texts)
    assert resp.object == "list" and resp.model == MODEL_NAME
    assert [d.index for d in resp.data] == list(range(len(texts)))
    assert resp.usage.prompt_tokens == sum(len(e["ids"]) for e in WITH_VECTORS)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens
    for d, e in zip(resp.data, WITH_VECTORS):
        assert len(d.embedding) == 384
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-5  # L2-normalized
        assert cosine(d.embedding, e["embedding"]) >= 0.9999, e["text"][:60]


def test_batch_of_256_equals_each_alone(embed_server):
    c = client(embed_server)
    texts = [WITH_VECTORS[i % len(WITH_VECTORS)]["text"] for i in range(256)]
    batched = [d.embedding for d in c.embeddings.create(model=MODEL_NAME, input=texts).data]
    assert len(batched) == 256
    for i, e in enumerate(WITH_VECTORS):
        alone = c.embeddings.create(model=MODEL_NAME, input=e["text"]).data[0].embedding
        for j in range(i, 256, len(WITH_VECTORS)):
            assert batched[j] == alone, f"input {j}"


def test_token_ids_and_base64(embed_server):
    e = WITH_VECTORS[0]
    c = client(embed_server)
    from_text = c.embeddings.create(model=MODEL_NAME, input=e["text"]).data[0].embedding
    from_ids = c.embeddings.create(model=MODEL_NAME, input=[e["ids"]]).data[0].embedding
    assert from_ids == from_text
    raw = requests.post(embed_server.base_url + "/v1/embeddings",
                        json={"input": e["text"], "encoding_format": "base64"}, timeout=60).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == from_text
    # The openai client asks for base64 by default and decodes it itself: the same vector.
    assert c.embeddings.create(model=MODEL_NAME, input=e["text"], encoding_format="base64").data[0].embedding
    assert c.embeddings.create(model=MODEL_NAME, input=e["text"], dimensions=384).data[0].embedding == from_text


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 128}, "dimensions"),
    ({"input": [[30522]]}, "input"),
    ({"input": " ".join(["word"] * 600)}, "input"),
    ({"model": "other", "input": "a"}, None),
])
def test_embedding_bad_input(embed_server, body, param):
    r = requests.post(embed_server.base_url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == (404 if "model" in body else 400), r.text
    err = r.json()["error"]
    assert err["message"]
    if param:
        assert err["param"] == param


def test_embedding_model_refuses_generation_and_rerank(embed_server):
    with pytest.raises(openai.BadRequestError) as e:
        client(embed_server).completions.create(model=MODEL_NAME, prompt="hello", max_tokens=4)
    assert "cannot generate" in str(e.value)
    r = requests.post(embed_server.base_url + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=60)
    assert r.status_code == 400 and "cannot rerank" in r.json()["error"]["message"]


def test_generative_model_refuses_embeddings(server):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).embeddings.create(model=server.model, input="hello")
    assert "cannot embed" in str(e.value)


def test_decoder_embeddings_match_llama_cpp(decoder_embed_server):
    c = client(decoder_embed_server)
    texts = [e["text"] for e in QWEN3_EXPECTED]
    resp = c.embeddings.create(model=MODEL_NAME, input=texts)
    assert resp.usage.prompt_tokens == sum(len(e["ids"]) for e in QWEN3_EXPECTED)  # EOS appended, as llama.cpp
    worst = 1.0
    for d, e in zip(resp.data, QWEN3_EXPECTED):
        assert len(d.embedding) == len(e["embedding"]) == 32
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-5  # L2-normalized
        worst = min(worst, cosine(d.embedding, e["embedding"]))
        assert cosine(d.embedding, e["embedding"]) >= 0.9999, e["text"][:60]
    print(f"lowest cosine to llama.cpp: {worst:.9f}")
    # The batch's vectors are each input's alone; token ids embed as the text does.
    for i, e in enumerate(QWEN3_EXPECTED):
        assert c.embeddings.create(model=MODEL_NAME, input=e["text"]).data[0].embedding == resp.data[i].embedding
    assert c.embeddings.create(model=MODEL_NAME, input=[QWEN3_EXPECTED[0]["ids"]]).data[0].embedding == \
        resp.data[0].embedding


def test_decoder_embedding_model_refuses_generation(decoder_embed_server):
    with pytest.raises(openai.BadRequestError) as e:
        client(decoder_embed_server).completions.create(model=MODEL_NAME, prompt="hello", max_tokens=4)
    assert "cannot generate" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client(decoder_embed_server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert "cannot generate" in str(e.value)


def test_rerank_scores_match_llama_cpp(rerank_server):
    by_query: dict[str, list] = {}
    for p in RERANK:
        by_query.setdefault(p["query"], []).append(p)
    for path in ("/v1/rerank", "/rerank"):
        for query, pairs in by_query.items():
            documents = [p["document"] for p in pairs]
            r = requests.post(rerank_server.base_url + path,
                              json={"model": MODEL_NAME, "query": query, "documents": documents}, timeout=60)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["object"] == "list"
            assert out["usage"]["prompt_tokens"] == sum(len(p["ids"]) for p in pairs)
            results = out["results"]
            assert sorted(x["index"] for x in results) == list(range(len(documents)))
            scores = [x["relevance_score"] for x in results]
            assert scores == sorted(scores, reverse=True)
            for x in results:
                assert abs(x["relevance_score"] - pairs[x["index"]]["score"][0]) < 1e-4
                assert x["document"]["text"] == documents[x["index"]]


def test_rerank_top_n_and_bad_input(rerank_server):
    url = rerank_server.base_url + "/v1/rerank"
    r = requests.post(url, json={"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": False},
                      timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 2 and "document" not in r.json()["results"][0]
    for body, param in [({"query": "q", "documents": []}, "documents"),
                        ({"documents": ["a"]}, "query"),
                        ({"query": "q", "documents": ["d"] * 1025}, "documents"),
                        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n")]:
        r = requests.post(url, json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    r = requests.post(rerank_server.base_url + "/v1/embeddings", json={"input": "a"}, timeout=60)
    assert r.status_code == 400 and "reranker" in r.json()["error"]["message"]
