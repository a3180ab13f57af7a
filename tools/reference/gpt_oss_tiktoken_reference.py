#!/usr/bin/env python3
"""A second, independent reference for gpt-oss's tokenizer: OpenAI's `tiktoken`
(pip install tiktoken; its o200k_harmony definition, with the o200k_base ranks
read offline from js-tiktoken as make_gpt_oss_vocab.py reads them, hash-checked;
tiktoken itself would download them). No llama.cpp, no merges: tiktoken merges
by the ranks directly.

For every UTF-8 corpus entry (tests/data/tokenizer/corpus.jsonl; the invalid
UTF-8 entries cannot be tiktoken input) it writes
tests/data/tokenizer/gpt-oss.tiktoken.jsonl:
    {"id": N, "s": [...], "p": [...]}  (+ "why_s"/"why_p" where llama.cpp differs)
  s = encode(text, allowed_special="all")   (llama.cpp: add_special, parse_special)
  p = encode_ordinary(text)                 (llama.cpp: neither)
Where tiktoken and llama.cpp (gpt-oss.expected.jsonl) differ, the reason is
found, not assumed:
  "pattern": tiktoken with llama.cpp's gpt-4o regex as pat_str gives llama.cpp's
             ids, so the difference is the pre-tokenizer rewrite alone (non-ASCII
             capitals count as lower case too; combining marks are no letters);
  "special": the text holds <|channel|>, <|message|>, <|start|>, <|constrain|>
             or <|end|>, which llama.cpp makes USER_DEFINED and so matches even
             without parse_special, or o200k_harmony's extra name <|endofprompt|>
             for 200018 (the GGUF has <|reserved_200018|> there).
Any other difference stops the script. With llama.cpp's regex, tiktoken must
give llama.cpp's ids for every entry and mode but the "special" ones: that checks
the merges that make_gpt_oss_vocab.py recovered, over the whole corpus.

    python3 tools/reference/gpt_oss_tiktoken_reference.py --js-tiktoken js-tiktoken-1.0.21.tgz
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import tiktoken
import tiktoken_ext.openai_public as openai_public

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gpt_oss_vocab as vocab  # noqa: E402

# llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O (as src/tokenizer/pretokenize.cpp).
LLAMA_CPP_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
USER_DEFINED = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"]


def harmony_encoding(ranks):
    """tiktoken's own o200k_harmony constructor, its download replaced by `ranks`."""
    real = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        spec = openai_public.o200k_harmony()
    finally:
        openai_public.load_tiktoken_bpe = real
    return spec


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data_dir = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "tokenizer"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--js-tiktoken", help="js-tiktoken .tgz (npm pack) or its dist/ranks/o200k_base.js")
    ap.add_argument("--npm", action="store_true", help=f"run `npm pack {vocab.JS_TIKTOKEN}` into a temporary directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = args.js_tiktoken
        if not src:
            if not args.npm:
                raise SystemExit("give --js-tiktoken PATH or --npm")
            name = subprocess.run(["npm", "pack", vocab.JS_TIKTOKEN], cwd=tmp, check=True, capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1]
            src = os.path.join(tmp, name)
        ranks = vocab.read_js_ranks(src)
    vocab.check_ranks(ranks)

    spec = harmony_encoding(ranks)
    enc = tiktoken.Encoding(**spec)
    spec_ll = dict(spec, name="o200k_harmony_llama_cpp_regex", pat_str=LLAMA_CPP_GPT4O)
    enc_ll = tiktoken.Encoding(**spec_ll)
    # The GGUF's special tokens are tiktoken's, but for the second name of 200018.
    want = {i: t for t, i in spec["special_tokens"].items() if t != "<|endofprompt|>"}
    assert want == vocab.special_tokens(), "special tokens differ from tiktoken's o200k_harmony"

    with open(os.path.join(data_dir, "corpus.jsonl"), encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    with open(os.path.join(data_dir, "gpt-oss.expected.jsonl"), encoding="utf-8") as f:
        expected = {r["id"]: r for r in map(json.loads, f)}

    lines, counts = [], {}
    for e in corpus:
        if "hex" in e:
            continue
        text = e["text"]
        rec = {"id": e["id"], "s": enc.encode(text, allowed_special="all"), "p": enc.encode_ordinary(text)}
        ll = {"s": enc_ll.encode(text, allowed_special="all"), "p": enc_ll.encode_ordinary(text)}
        special = any(t in text for t in USER_DEFINED)
        for mode in ("s", "p"):
            ref = expected[e["id"]][mode]
            mode_special = ("<|endofprompt|>" in text) or (mode == "p" and special)
            if ll[mode] != ref and not mode_special:
                raise SystemExit(f"#{e['id']} {text!r} ({mode}): tiktoken with llama.cpp's regex {ll[mode]} "
                                 f"!= llama.cpp {ref}")
            if rec[mode] == ref:
                continue
            why = "pattern" if ll[mode] == ref else "special"
            rec["why_" + mode] = why
            counts[(mode, why)] = counts.get((mode, why), 0) + 1
        lines.append(json.dumps(rec, separators=(",", ":")))
    out = os.path.join(data_dir, "gpt-oss.tiktoken.jsonl")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: {len(lines)} entries (tiktoken {tiktoken.__version__}); differences from llama.cpp: "
          + ", ".join(f"{m}/{w} {n}" for (m, w), n in sorted(counts.items())))


if __name__ == "__main__":
    main()
