"""LLM.embed (vLLM's shape: .outputs.embedding, .prompt_token_ids) on the MiniLM encoder
GGUF against Hugging Face's vectors (tools/reference/embedding_reference.py) and on the tiny
decoder embedding model (qwen3, last-token pooling) against llama.cpp's
(tools/reference/decoder_embedding_reference.py): L2-normalized, as /v1/embeddings returns them.
An embedding model refuses to generate; a generative one refuses to embed."""
from __future__ import annotations

import json
import math

import pytest

import inferd

from pkg_support import REPO, e2e

DATA = REPO / "tests" / "data"
MINILM = e2e.MODEL_DIR / "all-MiniLM-L6-v2.f16.gguf"
QWEN3_EMBED = DATA / "models" / "tiny-qwen3-embed-last.gguf"
ARGS = dict(threads=2, kv_cache_memory="64M")


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_encoder_embeddings_match_hugging_face():
    if not MINILM.exists():
        pytest.fail(f"{MINILM} is missing: run scripts/fetch_models.sh --all")
    expected = [json.loads(line) for line in (DATA / "embeddings" / "all-minilm-l6-v2.expected.jsonl")
                .read_text().splitlines()]
    expected = [e for e in expected if "embedding" in e and e["text"]][:24]
    llm = inferd.LLM(str(MINILM), **ARGS)
    outs = llm.embed([e["text"] for e in expected], use_tqdm=False)
    assert len(outs) == len(expected)
    for out, e in zip(outs, expected):
        assert isinstance(out, inferd.EmbeddingRequestOutput)
        assert out.prompt_token_ids == e["ids"]
        assert len(out.outputs.embedding) == 384 and all(isinstance(x, float) for x in out.outputs.embedding)
        assert abs(math.sqrt(sum(x * x for x in out.outputs.embedding)) - 1.0) < 1e-5
        assert cosine(out.outputs.embedding, e["embedding"]) >= 0.9999, e["text"][:60]
    with pytest.raises(ValueError, match="cannot generate"):
        llm.generate("hello", inferd.SamplingParams(max_tokens=4), use_tqdm=False)


def test_decoder_embeddings_match_llama_cpp():
    expected = json.loads((DATA / "embeddings" / "tiny-qwen3-embed-last.expected.json").read_text())["sentences"]
    llm = inferd.LLM(str(QWEN3_EMBED), **ARGS, numerics="exact")  # llama.cpp's vectors: its arithmetic
    outs = llm.embed([e["text"] for e in expected], use_tqdm=False)
    for out, e in zip(outs, expected):
        assert out.prompt_token_ids == e["ids"]  # <|endoftext|> appended, as llama.cpp does
        assert cosine(out.outputs.embedding, e["embedding"]) >= 0.9999, e["text"][:60]
        assert max(abs(a - b) for a, b in zip(out.outputs.embedding, e["embedding"])) < 1e-4
    # One prompt alone, and as token ids, gives the batch's vector.
    alone = llm.embed(expected[1]["text"], use_tqdm=False)[0]
    assert alone.outputs.embedding == outs[1].outputs.embedding
    assert llm.embed({"prompt_token_ids": expected[1]["ids"]})[0].outputs.embedding == outs[1].outputs.embedding
    with pytest.raises(ValueError, match="cannot generate"):
        llm.generate("hello", inferd.SamplingParams(max_tokens=4), use_tqdm=False)


def test_generative_model_refuses_to_embed(llm):
    with pytest.raises(ValueError, match="cannot embed"):
        llm.embed("hello", use_tqdm=False)
