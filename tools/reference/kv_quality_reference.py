#!/usr/bin/env python3
"""llama.cpp's KL divergence of a quantized KV cache from its f16 cache, for
tests/unit/engine_perplexity_test.cpp (LlamaCppKVQuality).

Runs llama-perplexity over tests/data/text/perplexity_corpus.txt as bench/compare_kv_quality.py
does (flash attention on, which llama.cpp needs for a quantized latent or V cache: first the f16
run's logits as the base, then -ctk/-ctv T with --kl-divergence) and writes
tests/data/kv_quality/<model stem>.json: per cache type, llama.cpp's mean KL divergence, its
perplexity and its same-top share. The test asks inferd's cache of each type to cost no more KL
(against inferd's own f16 cache, same windows) than llama.cpp's does.

Usage: tools/reference/kv_quality_reference.py [--model PATH] [--types q8_0,q4_0] [--context 128] [--chunks 8]
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import compare_kv_quality as ckq  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "tests/data/models/tiny-deepseek2-latent128.gguf")
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/kv_quality")
    args = ap.parse_args()
    args.model = str(args.model)
    types = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = str(Path(tmp) / "f16.kld")
        f16 = ckq.llama(args, "f16", base)
        for t in args.types.split(","):
            types[t] = ckq.llama(args, t, base)
    out = {"generator": "tools/reference/kv_quality_reference.py", "date_utc": time.strftime("%Y-%m-%d", time.gmtime()),
           "model": Path(args.model).name, "corpus": str(ckq.CORPUS.relative_to(ROOT)), "context": args.context,
           "chunks": args.chunks, "llama_perplexity": "-fa on, -b = -c; base: f16 cache; then -ctk T -ctv T",
           "f16_perplexity": f16["ppl"],
           "types": {t: {"kl_divergence_mean": r["kld"], "kl_divergence_p99": r["kld_p99"], "perplexity": r["ppl"],
                         "same_top": r["same_top"]} for t, r in types.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{Path(args.model).stem}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}: " + ", ".join(f"{t} KLD {r['kld']:.6f}" for t, r in types.items()))


if __name__ == "__main__":
    main()
