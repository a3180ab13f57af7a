#!/usr/bin/env python3
"""What a compressed KV cache costs in quality, inferd beside llama.cpp, same model, same text.

For each KV cache type, both engines score the committed corpus (tests/data/text/
perplexity_corpus.txt) in llama-perplexity's windows and report perplexity and the KL divergence
of every scored position's prediction from the same engine's f16 cache:

  inferd     `inferd perplexity --kv-cache-dtype T --kl-divergence --json` (the f16 cache runs
             beside the chosen one in the same process; KL exact over the vocabulary)
  llama.cpp  `llama-perplexity --kl-divergence-base` from its own f16 run, then -ctk T -ctv T;
             flash attention on in every llama.cpp run (llama.cpp needs it for a quantized V
             cache), so its f16 baseline is its flash-attention path

Usage: bench/compare_kv_quality.py --model PATH [--types q8_0,q4_0] [--context 512] [--chunks 16]
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
LLAMA = CACHE / "llama.cpp" / "build" / "bin" / "llama-perplexity"
CORPUS = ROOT / "tests" / "data" / "text" / "perplexity_corpus.txt"


def inferd(args, kv_type):
    out = subprocess.run([args.inferd, "perplexity", "-m", args.model, "-f", str(CORPUS), "-c", str(args.context),
                          "-b", str(args.context), "--chunks", str(args.chunks), "--kv-cache-dtype", kv_type,
                          "--kl-divergence", "--json", "-t", str(args.threads)],
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return {"ppl": j["perplexity"], "ppl_base": j["perplexity_f16"], "kld": j["kl_divergence_mean"],
            "kld_p99": j["kl_divergence_p99"], "same_top": j["same_top"]}


def llama(args, kv_type, base_file):
    cmd = [str(LLAMA), "-m", args.model, "-c", str(args.context), "-b", str(args.context), "--chunks",
           str(args.chunks), "-fa", "on", "-t", str(args.threads)]
    if kv_type == "f16":
        cmd += ["-f", str(CORPUS), "--kl-divergence-base", base_file]
    else:
        cmd += ["--kl-divergence-base", base_file, "--kl-divergence", "-ctk", kv_type, "-ctv", kv_type]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    if kv_type == "f16":
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
        return {"ppl": float(m.group(1))}
    ppl = re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", text)
    kld = re.search(r"Mean\s+KLD:\s*([0-9.]+)", text)
    p99 = re.search(r"99\.0%\s+KLD:\s*([0-9.]+)", text)
    top = re.search(r"Same top p:\s*([0-9.]+)", text)
    if not (ppl and kld):
        raise RuntimeError(f"unexpected llama-perplexity output:\n{text[-3000:]}")
    return {"ppl": float(ppl.group(1)), "kld": float(kld.group(1)),
            "kld_p99": float(p99.group(1)) if p99 else float("nan"),
            "same_top": float(top.group(1)) / 100 if top else float("nan")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    args = ap.parse_args()
    types = args.types.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        base = str(Path(tmp) / "f16.kld")
        llama_f16 = llama(args, "f16", base)
        rows = []
        for t in types:
            rows.append((t, inferd(args, t), llama(args, t, base)))
    print(f"Model {Path(args.model).name}; corpus {CORPUS.relative_to(ROOT)}, windows of {args.context}, "
          f"{args.chunks} windows; llama.cpp f16 (flash attention) PPL {llama_f16['ppl']:.4f}.\n")
    print("| KV cache | inferd PPL (f16 PPL) | inferd mean KLD | inferd 99% KLD | inferd same top | "
          "llama.cpp PPL | llama.cpp mean KLD | llama.cpp 99% KLD | llama.cpp same top |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t, i, l in rows:
        print(f"| {t} | {i['ppl']:.4f} ({i['ppl_base']:.4f}) | {i['kld']:.6f} | {i['kld_p99']:.6f} | "
              f"{100 * i['same_top']:.2f}% | {l['ppl']:.4f} | {l['kld']:.6f} | {l['kld_p99']:.6f} | "
              f"{100 * l['same_top']:.2f}% |")


if __name__ == "__main__":
    main()
