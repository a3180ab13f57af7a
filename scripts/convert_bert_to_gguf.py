#!/usr/bin/env python3
"""Converts a Hugging Face BERT sentence-embedding model (config.json,
model.safetensors, tokenizer.json, 1_Pooling/config.json) into a GGUF laid out
as llama.cpp's converter lays out `bert` models, so inferd and llama.cpp read
the same file: tensor names (token_embd, position_embd, token_types,
token_embd_norm, blk.N.attn_{q,k,v,output}, attn_output_norm, ffn_up,
ffn_down, layer_output_norm), the WordPiece vocabulary in llama.cpp's
"phantom space" form (a word-initial piece gets a leading U+2581, a "##"
continuation loses its prefix, special tokens stay as they are), the special
ids and the pooling type.

Needs only numpy and the `gguf` package (no torch): the safetensors file is
read directly. Matrices are written as F16 (llama.cpp's default for such
models), vectors as F32.

  convert_bert_to_gguf.py MODEL_DIR OUT.gguf
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

# sentence-transformers' pooling modes -> llama.cpp's llama_pooling_type.
POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2, "pooling_mode_lasttoken": 3}

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path: Path) -> dict:
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[base + begin : base + end], dtype=SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return tensors


def gguf_name(hf: str) -> str | None:
    name = hf.removeprefix("bert.")
    fixed = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    if name in fixed:
        return fixed[name]
    if not name.startswith("encoder.layer."):
        return None  # position_ids, the pooler and the pre-training heads are not used
    rest = name.removeprefix("encoder.layer.")
    block, rest = rest.split(".", 1)
    per_layer = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    module, kind = rest.rsplit(".", 1)
    return f"blk.{block}.{per_layer[module]}.{kind}"


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    pooling_config = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    pooling = next((v for k, v in POOLING.items() if pooling_config.get(k)), None)
    if pooling is None:
        sys.exit(f"error: {model_dir}: no supported pooling mode in 1_Pooling/config.json")
    if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
        sys.exit(f"error: {model_dir}: not a BERT model with GELU activations")

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(config.get("_name_or_path", model_dir.name))
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_head_count(config["num_attention_heads"])
    w.add_layer_norm_eps(config["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))

    vocab = tokenizer["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    types, pieces = [], []
    for i, text in enumerate(tokens):
        if i in special:
            types.append(gguf.TokenType.CONTROL)
            pieces.append(text)
        else:
            types.append(gguf.TokenType.NORMAL)
            pieces.append(text[2:] if text.startswith("##") else "\u2581" + text)
    w.add_token_type_count(config.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_types(types)
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", ids["[CLS]"])
    w.add_mask_token_id(ids["[MASK]"])
    w.add_bos_token_id(ids["[CLS]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)

    for hf, array in read_safetensors(model_dir / "model.safetensors").items():
        name = gguf_name(hf)
        if name is None:
            continue
        array = np.ascontiguousarray(array, dtype=np.float32)
        # Matrices in f16; token_types stays f32 as llama.cpp's converter keeps it, because
        # llama.cpp adds that row to f32 activations directly and refuses an f16 one.
        if array.ndim == 2 and name != "token_types.weight":
            array = array.astype(np.float16)
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
