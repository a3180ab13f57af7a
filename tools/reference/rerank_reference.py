#!/usr/bin/env python3
"""Reranking scores of tests/data/models/tiny-bert-reranker.gguf (make_tiny_models.py) by
llama.cpp, through llama-cpp-python's low-level API: for each (query, document) pair of
the list below, the cross-encoder input [CLS] query [SEP] document [SEP] (the query and
the document tokenized by llama.cpp's WordPiece tokenizer without special tokens), run
with rank pooling (the [CLS] row through the classification head), and the score.

Writes tests/data/rerank/tiny-bert-reranker.expected.json:
    {"pairs": [{"query", "document", "ids", "score"}, ...]}
which tests/unit/model_encoder_rank_test.cpp compares with inferd's tokens and scores.

    python3 tools/reference/rerank_reference.py
"""
import ctypes
import json
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests/data/models/tiny-bert-reranker.gguf"
OUT = ROOT / "tests/data/rerank/tiny-bert-reranker.expected.json"

QUERIES = {
    "What is the capital of France?": [
        "Paris is the capital and largest city of France.",
        "Berlin is the capital of Germany.",
        "The Eiffel Tower was completed in 1889.",
        "Bananas are rich in potassium.",
    ],
    "how do transformers use attention": [
        "Attention lets each token weigh every other token of the input.",
        "Electrical transformers change the voltage of alternating current.",
        "Café au lait, crème brûlée and naïve questions — déjà vu!",
        "",
    ],
}


def main() -> None:
    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def quiet(level, text, user_data):
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(MODEL).encode(), llama_cpp.llama_model_default_params())
    vocab = llama_cpp.llama_model_get_vocab(model)
    cparams = llama_cpp.llama_context_default_params()
    cparams.embeddings = True
    cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_RANK
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_threads = cparams.n_threads_batch = 2
    # Attention in F32 (flash attention would round queries, keys and values to F16).
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    n_out = llama_cpp.llama_model_n_cls_out(model)

    def tokenize(text: str):
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(data) + 16, False, False)
        return list(buf[:n])

    cls, sep = llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_sep(vocab)
    pairs = []
    for query, documents in QUERIES.items():
        for document in documents:
            ids = [cls] + tokenize(query) + [sep] + tokenize(document) + [sep]
            batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
            for i, t in enumerate(ids):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(ids)
            if llama_cpp.llama_encode(ctx, batch) != 0:
                raise RuntimeError("llama_encode failed")
            scores = llama_cpp.llama_get_embeddings_seq(ctx, 0)
            pairs.append({"query": query, "document": document, "ids": ids,
                          "score": [float(scores[j]) for j in range(n_out)]})
            llama_cpp.llama_batch_free(batch)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"pairs": pairs}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(pairs)} pairs to {OUT}")


if __name__ == "__main__":
    main()
