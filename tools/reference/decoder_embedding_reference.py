#!/usr/bin/env python3
"""Embeddings of the tiny decoder embedding models (make_tiny_models.py:
tiny-qwen3-embed-last, last-token pooling; tiny-llama-embed-mean, mean pooling)
by llama.cpp, through llama-cpp-python's low-level API: for each sentence below,
llama.cpp's tokens (its tokenizer with the vocabulary's own BOS/EOS flags, no
special-token parsing), one llama_decode with embeddings on, every token an
output and the model's own pooling type, then llama_get_embeddings_seq: the
pooled final-normed hidden state. llama.cpp returns it unnormalized; /v1/embeddings
returns it L2-normalized (as llama-server does by default), so the file holds both,
the normalized one by llama-cpp-python's normalize_embedding.

Writes tests/data/embeddings/<model>.expected.json:
    {"model", "pooling", "ggml_flavour", "sentences": [{"text", "ids", "raw", "embedding"}, ...]}
(ggml_flavour: the GGML build whose arithmetic made the vectors, which the test loads the model with)
read by tests/unit/model_decoder_embedding_test.cpp, tests/e2e/test_embeddings.py and
tests/python/test_embed.py.

    python3 tools/reference/decoder_embedding_reference.py
"""
import ctypes
import json
import sys
from pathlib import Path

import llama_cpp
from llama_cpp._internals import normalize_embedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
import logits_reference as lr  # noqa: E402  (ggml_flavour, shared with the logits reference)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["tiny-qwen3-embed-last", "tiny-llama-embed-mean"]
POOLING_NAMES = {llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean", llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
                 llama_cpp.LLAMA_POOLING_TYPE_LAST: "last"}

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "hello",
    "Café au lait, crème brûlée and naïve questions — déjà vu!",
    "東京は日本の首都です。",
    "def add(a, b):\n    return a + b\n",
    "A longer sentence, so that the pooled state reads many positions: attention in a causal "
    "decoder lets each token see only those before it, and the last one sees them all.",
]


def embed_all(path: Path):
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    vocab = llama_cpp.llama_model_get_vocab(model)
    cparams = llama_cpp.llama_context_default_params()
    cparams.embeddings = True  # pooling_type stays unspecified: the GGUF's own
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_threads = cparams.n_threads_batch = 2
    # Attention in F32 (flash attention would round queries, keys and values to F16).
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    pooling = llama_cpp.llama_pooling_type(ctx)
    n_embd = llama_cpp.llama_model_n_embd(model)

    def tokenize(text: str):
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(data) + 16, True, False)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed for {text!r}")
        return list(buf[:n])

    out = []
    for text in SENTENCES:
        ids = tokenize(text)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(ids)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        pooled = llama_cpp.llama_get_embeddings_seq(ctx, 0)
        raw = [float(pooled[j]) for j in range(n_embd)]
        out.append({"text": text, "ids": ids, "raw": raw, "embedding": [float(v) for v in normalize_embedding(raw)]})
        llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return POOLING_NAMES[pooling], out


def main() -> None:
    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def quiet(level, text, user_data):
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    flavour = lr.ggml_flavour(llama_cpp.llama_print_system_info().decode())
    for name in MODELS:
        pooling, sentences = embed_all(ROOT / "tests/data/models" / f"{name}.gguf")
        path = ROOT / "tests/data/embeddings" / f"{name}.expected.json"
        path.write_text(json.dumps({"model": f"{name}.gguf", "pooling": pooling, "ggml_flavour": flavour,
                                    "sentences": sentences},
                                   ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {len(sentences)} sentences ({pooling} pooling) to {path}")


if __name__ == "__main__":
    main()
