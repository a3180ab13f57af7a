#!/usr/bin/env python3
"""llama.cpp's own greedy agreement between its f16 and quantized KV caches, measured as
engine_kv_quant_test measures inferd's: 64 greedy tokens after each of the reference prompts
(tests/data/logits/<model>/prompts.json), the share of tokens before the first divergence from the
f16 cache's continuation. Flash attention on (llama.cpp needs it for a quantized V cache), and the f16
cache without it as llama.cpp's own noise floor. Through llama-cpp-python.

Usage: tools/reference/kv_agreement_reference.py tests/data/logits/smollm2-135m MODEL.gguf
"""
import json, sys
from pathlib import Path
import llama_cpp

logits_dir, model = Path(sys.argv[1]), sys.argv[2]
prompts = json.load(open(logits_dir / "prompts.json"))
N = 64

def continuation(llm, ids):
    llm.reset()
    out = []
    for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        out.append(tok)
        if len(out) == N:
            break
    return out

def make(type_kv, fa):
    return llama_cpp.Llama(model_path=model, n_ctx=2048, n_threads=2, flash_attn=fa, type_k=type_kv,
                           type_v=type_kv, verbose=False, logits_all=False)

F16, Q8_0, Q4_0 = 1, 8, 2
base = make(F16, True)
variants = {"f16, no flash attention": make(F16, False), "q8_0": make(Q8_0, True), "q4_0": make(Q4_0, True)}
want = [continuation(base, p["ids"]) for p in prompts]
for name, llm in variants.items():
    before = identical = 0
    for p, w in zip(prompts, want):
        got = continuation(llm, p["ids"])
        n = next((i for i, (a, b) in enumerate(zip(got, w)) if a != b), len(w))
        before += n
        identical += n == len(w)
    print(f"{Path(model).name}, llama.cpp {name} vs its f16 flash-attention cache: "
          f"{100 * before / (N * len(prompts)):.1f}% of tokens before the first divergence "
          f"({identical}/{len(prompts)} identical)", flush=True)
