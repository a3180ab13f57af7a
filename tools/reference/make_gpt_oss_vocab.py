#!/usr/bin/env python3
"""Writes gpt-oss's tokenizer (o200k_harmony) as a vocabulary-only GGUF:
tests/data/vocab/gpt-oss-vocab.gguf, for tiny random-weight gpt-oss models and
the tokenizer tests. No weights, no tensors.

Source of the BPE ranks: the o200k_base ranks shipped in the npm package
js-tiktoken (dist/ranks/o200k_base.js, base64 tokens grouped by starting rank).
tiktoken itself downloads o200k_base.tiktoken at run time, which we do not do;
instead the ranks are rewritten in the .tiktoken format (base64 token, space,
rank, one per line) and checked against the SHA-256 that tiktoken pins for that
file, so they are exactly OpenAI's.

    npm pack js-tiktoken@1.0.21             # or let the script run it (--npm)
    python3 tools/reference/make_gpt_oss_vocab.py --js-tiktoken js-tiktoken-1.0.21.tgz

What is written is what llama.cpp's convert_hf_to_gguf.py writes for gpt-oss
(GptOssModel.set_vocab -> _set_vocab_gpt2 -> get_vocab_base + SpecialVocab) from
openai/gpt-oss-20b's tokenizer files:
  tokenizer.ggml.model       "gpt2"
  tokenizer.ggml.pre         "gpt-4o" (the hash of o200k's chktxt tokenization)
  tokenizer.ggml.tokens      201,088: the 199,998 o200k_base tokens in GPT-2 byte-to-unicode
                             form, then the harmony special tokens 199998..201087
  tokenizer.ggml.token_type  NORMAL (1) for the BPE tokens, CONTROL (3) for all the
                             special tokens (they are "special": true added tokens)
  tokenizer.ggml.merges      recovered from the ranks as Hugging Face's TikTokenConverter
                             does (transformers convert_slow_tokenizer.py): for every token,
                             every split into two tokens, ordered by the token's rank and
                             then by the ranks of the two halves
  tokenizer.ggml.bos_token_id      199998 <|startoftext|>   (tokenizer_config bos_token)
  tokenizer.ggml.eos_token_id      200002 <|return|>        (tokenizer_config eos_token)
  tokenizer.ggml.padding_token_id  199999 <|endoftext|>     (tokenizer_config pad_token)
  tokenizer.ggml.add_bos_token / add_eos_token  false       (ByteLevel post-processor)
No eot_token_id is written (the converter writes none for gpt-oss); llama.cpp finds
EOT and the end-of-generation set from token texts. The chat template is not
included (no source of it here); general.architecture is "gpt-oss" with no
hyperparameters, which is enough for a vocab_only load in llama.cpp.
"""
import argparse
import base64
import hashlib
import os
import re
import subprocess
import tarfile
import tempfile

# tiktoken_ext/openai_public.py: o200k_base's expected_hash.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
N_BASE = 199998
N_VOCAB = 201088
JS_TIKTOKEN = "js-tiktoken@1.0.21"

# tiktoken's o200k_harmony special tokens (its <|reserved_200018|> is o200k_base's
# <|endofprompt|> id; gpt-oss's tokenizer names it reserved).
HARMONY = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}


def special_tokens():
    return {i: HARMONY.get(i, f"<|reserved_{i}|>") for i in range(N_BASE, N_VOCAB)}


def read_js_ranks(src):
    """o200k_base ranks {bytes: rank} from js-tiktoken's .tgz or its o200k_base.js."""
    if src.endswith(".tgz"):
        with tarfile.open(src) as tf:
            text = tf.extractfile("package/dist/ranks/o200k_base.js").read().decode()
    else:
        with open(src, encoding="utf-8") as f:
            text = f.read()
    m = re.search(r'"bpe_ranks":"((?:[^"\\]|\\.)*)"', text)
    if not m:
        raise SystemExit(f"{src}: no bpe_ranks")
    ranks = {}
    for line in m.group(1).encode().decode("unicode_escape").split("\n"):
        if not line:
            continue
        # "! <offset> <base64> <base64> ...": consecutive ranks from offset
        _, offset, *tokens = line.split(" ")
        for i, t in enumerate(tokens):
            ranks[base64.b64decode(t)] = int(offset) + i
    return ranks


def check_ranks(ranks):
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in by_rank] != list(range(N_BASE)):
        raise SystemExit("o200k_base ranks are not 0..199997")
    tiktoken_file = b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in by_rank)
    digest = hashlib.sha256(tiktoken_file).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise SystemExit(f"o200k_base ranks hash {digest}, tiktoken expects {O200K_BASE_SHA256}")
    return tiktoken_file


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocab_and_merges(ranks):
    enc = bytes_to_unicode()

    def text(b):
        return "".join(enc[x] for x in b)

    tokens = [None] * N_BASE
    merges = []
    for token, rank in ranks.items():
        tokens[rank] = text(token)
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2])  # stable: each token's splits keep their order
    return tokens, [f"{text(a)} {text(b)}" for a, b, _ in merges]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "vocab", "gpt-oss-vocab.gguf"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--js-tiktoken", help="js-tiktoken .tgz (npm pack) or its dist/ranks/o200k_base.js")
    ap.add_argument("--npm", action="store_true", help=f"run `npm pack {JS_TIKTOKEN}` into a temporary directory")
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--write-tiktoken", help="also write the ranks as an o200k_base.tiktoken file here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        src = args.js_tiktoken
        if not src:
            if not args.npm:
                raise SystemExit("give --js-tiktoken PATH or --npm")
            name = subprocess.run(["npm", "pack", JS_TIKTOKEN], cwd=tmp, check=True, capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1]
            src = os.path.join(tmp, name)
        ranks = read_js_ranks(src)
    tiktoken_file = check_ranks(ranks)
    if args.write_tiktoken:
        with open(args.write_tiktoken, "wb") as f:
            f.write(tiktoken_file)

    tokens, merges = vocab_and_merges(ranks)
    specials = special_tokens()
    tokens += [specials[i] for i in range(N_BASE, N_VOCAB)]
    assert len(tokens) == N_VOCAB and len(set(tokens)) == N_VOCAB

    import gguf

    types = [gguf.TokenType.NORMAL] * N_BASE + [gguf.TokenType.CONTROL] * (N_VOCAB - N_BASE)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    w = gguf.GGUFWriter(args.out, "gpt-oss")
    w.add_name("gpt-oss o200k_harmony vocabulary")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(199998)
    w.add_eos_token_id(200002)
    w.add_pad_token_id(199999)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.out}: {len(tokens)} tokens, {len(merges)} merges, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
