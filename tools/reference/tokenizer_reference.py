#!/usr/bin/env python3
"""Tokenizes every string of tests/data/tokenizer/corpus.jsonl with llama.cpp
(through llama-cpp-python, vocabulary only) and writes the reference ids that
tests/unit/tokenizer_test.cpp compares against.

For each model it writes tests/data/tokenizer/<name>.expected.jsonl, one line
per corpus entry:
    {"id": N, "s": [...], "p": [...], "ds": "...", "dp": "..."}
  s  = llama_tokenize(text, add_special=True,  parse_special=True)
  p  = llama_tokenize(text, add_special=False, parse_special=False)
  ds = llama_detokenize(s, remove_special=False, unparse_special=True)
  dp = llama_detokenize(p, remove_special=False, unparse_special=False)
  ("dp" is left out when equal to the text, "ds" when equal to the text after
   the BOS piece if s starts with BOS, else to the text, to keep it small;
   output that is not valid UTF-8 goes to "dsx"/"dpx" as hex instead.)
and <name>.meta.json with vocabulary-wide facts: size, BOS/EOS, add-BOS flag,
every end-of-generation id, and FNV-1a hashes over all token pieces.
For other pre-tokenizers (llama-bpe, qwen2, default, gpt-2) it re-labels
SmolLM2's vocabulary (a temporary GGUF with only tokenizer.ggml.pre changed)
and writes smollm2-135m@<pre>.variant.jsonl over a subset of the corpus.

    python3 tools/reference/tokenizer_reference.py [--models-dir DIR]
"""
import argparse
import ctypes
import json
import os
import sys

import llama_cpp

MODELS = {
    # expected-file name -> GGUF file name under the models directory
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    # Qwen2.5's vocabulary (151,936 ids, pre-tokenizer qwen2), shared by the -1.5B model and by
    # the tiny qwen3 model of make_tiny_models.py.
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    # gpt-oss's o200k_harmony (201,088 ids, pre-tokenizer gpt-4o): the committed vocabulary-only
    # GGUF of make_gpt_oss_vocab.py, read from the repository, not the models directory.
    "gpt-oss": "@tests/data/vocab/gpt-oss-vocab.gguf",
    # Qwen3.5's vocabulary (151,936 ids, pre-tokenizer qwen35), copied by
    # make_tiny_models.py into the committed tiny-qwen35 model from llama.cpp's ggml-vocab-qwen35.gguf.
    "qwen35": "@tests/data/models/tiny-qwen35.gguf",
}

# Other byte-level pre-tokenizers, checked on SmolLM2's vocabulary and merges
# with only tokenizer.ggml.pre changed, over every VARIANT_STRIDE-th corpus
# entry (plus all special-token, odd-character and invalid-UTF-8 entries): <pre>.variant.jsonl.
VARIANT_BASE = "smollm2-135m"
VARIANT_PRES = ["llama-bpe", "qwen2", "default", "gpt-2"]
VARIANT_STRIDE = 4


def variant_entries(corpus):
    return [e for e in corpus if e["id"] % VARIANT_STRIDE == 0 or e["kind"] in ("special", "odd", "bytes")]


def write_variant_gguf(src, pre, out):
    """Copies every metadata key of `src` (no tensors) with tokenizer.ggml.pre = pre."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(out, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.ggml.pre":
            w.add_string(key, pre)
        elif f.types[0] == GGUFValueType.ARRAY:
            if f.types[-1] == GGUFValueType.STRING:
                w.add_array(key, [bytes(f.parts[i]) for i in f.data])
            else:
                w.add_array(key, [f.parts[i].tolist()[0] for i in f.data])
        elif f.types[0] == GGUFValueType.STRING:
            w.add_string(key, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(key, f.parts[-1].tolist()[0], f.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_variants(base_path, corpus, out_dir):
    import tempfile

    entries = variant_entries(corpus)
    with tempfile.TemporaryDirectory() as tmp:
        for pre in VARIANT_PRES:
            path = os.path.join(tmp, f"{pre}.gguf")
            write_variant_gguf(base_path, pre, path)
            v = Vocab(path)
            lines = []
            for e in entries:
                text = entry_bytes(e)
                rec = {"id": e["id"], "s": v.tokenize(text, True, True), "p": v.tokenize(text, False, False)}
                lines.append(json.dumps(rec, separators=(",", ":")))
            with open(os.path.join(out_dir, f"{VARIANT_BASE}@{pre}.variant.jsonl"), "w") as f:
                f.write("\n".join(lines) + "\n")
            print(f"{VARIANT_BASE} with pre={pre}: {len(lines)} entries")


def _silence_logs():
    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _log(level, text, user_data):
        pass

    _silence_logs.keep = _log  # keep the callback alive
    llama_cpp.llama_log_set(_log, ctypes.c_void_p())


class Vocab:
    def __init__(self, path):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool):
        n_max = len(text) + 16
        while True:
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            n_max = -n

    def detokenize(self, ids, remove_special: bool, unparse_special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        while True:
            out = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, size, remove_special, unparse_special)
            if n >= 0:
                return out.raw[:n]
            size = -n + 1

    def piece(self, tok: int, special: bool) -> bytes:
        size = 64
        while True:
            out = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.vocab, tok, out, size, 0, special)
            if n >= 0:
                return out.raw[:n]
            size = -n


def ranges(ids):
    """[1, 2, 3, 7] -> [[1, 3], [7, 7]]"""
    out = []
    for t in ids:
        if out and out[-1][1] == t - 1:
            out[-1][1] = t
        else:
            out.append([t, t])
    return out


def fnv1a64(chunks):
    h = 0xCBF29CE484222325
    for b in chunks:
        for byte in len(b).to_bytes(4, "little") + b:
            h ^= byte
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def entry_bytes(e):
    return bytes.fromhex(e["hex"]) if "hex" in e else e["text"].encode("utf-8")


def write_model(name, path, corpus, out_dir):
    v = Vocab(path)
    bos = llama_cpp.llama_vocab_bos(v.vocab)
    bos_piece = v.piece(bos, True) if bos >= 0 else b""
    lines = []
    for e in corpus:
        text = entry_bytes(e)
        s = v.tokenize(text, True, True)
        p = v.tokenize(text, False, False)
        rec = {"id": e["id"], "s": s, "p": p}
        ds = v.detokenize(s, False, True)
        dp = v.detokenize(p, False, False)
        # The usual case, text or BOS + text, is implied and not written.
        usual_ds = bos_piece + text if s[:1] == [bos] else text
        for key, val, usual in (("ds", ds, usual_ds), ("dp", dp, text)):
            if val == usual:
                continue
            try:
                rec[key] = val.decode("utf-8")
            except UnicodeDecodeError:
                rec[key + "x"] = val.hex()
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    with open(os.path.join(out_dir, f"{name}.expected.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")

    vocab = v.vocab
    meta = {
        "gguf": os.path.basename(path),
        "n_vocab": v.n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": [t for t in range(v.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control_ranges": ranges(t for t in range(v.n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)),
        # FNV-1a 64 over (u32 little-endian length, bytes) of every token's piece, in id order.
        "piece_hash_special": "%016x" % fnv1a64(v.piece(t, True) for t in range(v.n_vocab)),
        "piece_hash_plain": "%016x" % fnv1a64(v.piece(t, False) for t in range(v.n_vocab)),
    }
    with open(os.path.join(out_dir, f"{name}.meta.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: {len(lines)} entries, {len(meta['eog'])} EOG ids")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data_dir = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "tokenizer"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default=os.environ.get(
        "INFERD_MODEL_DIR", os.path.expanduser("~/.cache/inferd/models")))
    ap.add_argument("--only", help="only this model name")
    ap.add_argument("--no-variants", action="store_true", help="skip the pre-tokenizer variants")
    args = ap.parse_args()
    _silence_logs()
    llama_cpp.llama_backend_init()
    with open(os.path.join(data_dir, "corpus.jsonl"), encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    for name, file in MODELS.items():
        if args.only and name != args.only:
            continue
        if file.startswith("@"):
            path = os.path.normpath(os.path.join(here, "..", "..", file[1:]))
        else:
            path = os.path.join(args.models_dir, file)
        if not os.path.exists(path):
            print(f"{name}: {path} not found, skipped", file=sys.stderr)
            continue
        write_model(name, path, corpus, data_dir)
        if name == VARIANT_BASE and not args.no_variants:
            write_variants(path, corpus, data_dir)


if __name__ == "__main__":
    main()
