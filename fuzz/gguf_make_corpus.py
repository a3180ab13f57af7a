#!/usr/bin/env python3
"""Writes small valid GGUF images into fuzz/corpus/gguf/ as seeds for gguf_fuzz.

Uses the `gguf` Python package (llama.cpp's gguf-py writer), so the seeds also
come from a writer independent of ours. Each image is a few hundred bytes.
Run from anywhere:  python3 fuzz/gguf_make_corpus.py
"""
import os
import struct

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType, GGUFValueType

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def write(name, build, arch="llama"):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, arch)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def all_value_types(w):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "hello")
    w.add_uint64("t.u64", 1 << 60)
    w.add_int64("t.i64", -(1 << 60))
    w.add_float64("t.f64", 0.1)
    w.add_array("t.arr_i", [1, 2, 3])
    w.add_array("t.arr_f", [0.5, -2.0])
    w.add_array("t.arr_s", ["a", "bc", ""])
    w.add_key_value("t.arr_b", [True, False], GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)


def small_model(w):
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(["<s>", "a", "b", "ab"])
    w.add_token_types([3, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float16))
    # One Q8_0 row of 32 elements = one 34-byte block; raw_shape is in bytes.
    w.add_tensor("blk.0.attn_q.weight", np.zeros(34, dtype=np.uint8),
                 raw_shape=(1, 34), raw_dtype=GGMLQuantizationType.Q8_0)


def spm_tokenizer(w):
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "\u2581a"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    w.add_token_types([2, 3, 3, 1])
    w.add_tensor("x", np.arange(8, dtype=np.float32))


def aligned_64(w):
    w.add_custom_alignment(64)
    w.add_tensor("a", np.ones(3, dtype=np.float32))
    w.add_tensor("b", np.ones((2, 2), dtype=np.float32))


def main():
    os.makedirs(OUT, exist_ok=True)
    write("all_value_types.gguf", all_value_types)
    write("small_model.gguf", small_model)
    write("spm_tokenizer.gguf", spm_tokenizer, arch="gemma3")
    path = write("aligned_64.gguf", aligned_64)
    # A version-2 variant: v2 and v3 differ only in the version field.
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<I", data, 4, 2)
    open(os.path.join(OUT, "aligned_64_v2.gguf"), "wb").write(bytes(data))
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} seeds, {total} bytes, to {OUT}")


if __name__ == "__main__":
    main()
