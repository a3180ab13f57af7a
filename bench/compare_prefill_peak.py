#!/usr/bin/env python3
"""Prompt processing against the host's int8 peak: inferd's exact and fast numerics tiers beside llama.cpp's
llama-bench, same models, same thread count, in one run; and the fast tier's KL divergence from the exact tier
beside a q8_0 KV cache's (what decides which tier is the default: docs/design.md, "Numerics tiers").

  peak      build/int8_peak: vpdpbusd (AVX-512 VNNI) and, where present, tdpbssd (AMX) on all threads, measured
            before the first and after the last prompt run; one multiply-add counts two operations; on a CPU
            without VNNI, AVX2's vpmaddubsw (the multiplier's rate: see int8_peak.cpp)
  pp512     a 512-token prompt from an empty cache: `inferd generate --numerics T --json` (its prompt timing),
            and llama-bench -p 512 -n 0; the engines alternate, one run each per repetition (median)
  share     the projections' operations (2 x tokens x the elements of every weight matrix but the token
            embedding and output tables) per second, over the VNNI peak (and the AMX peak where there is one);
            attention's products are left out, so the share understates a little
  KL        `inferd perplexity --kl-divergence` on the committed corpus: --numerics fast against exact with an
            f16 cache, and --kv-cache-dtype q8_0 (exact) against the same

  --old B   another inferd binary (say main's build) whose fast tier runs beside, alternating, as "old fast"
  --kl-only the KL table alone (no timings: it can run beside other work)

Usage: bench/compare_prefill_peak.py [--models A.gguf,B.gguf] [--threads 2] [--reps 3] [--chunks 8] [--old B]
                                     [--kl-only]
Prints Markdown for docs/benchmarks.md. On a shared VM the load moves everything: compare only figures from
the same run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llama_bench import CACHE, MODEL_DIR, ROOT, cpu_name, inferd_json, prompt_of  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "text" / "perplexity_corpus.txt"
LLAMA_BENCH = CACHE / "llama.cpp" / "build" / "bin" / "llama-bench"


def projection_elements(path):
    """Elements of the weight matrices a prompt token multiplies: every 2-D tensor but token_embd and output."""
    import gguf
    total = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if len(t.shape) >= 2 and t.name not in ("token_embd.weight", "output.weight"):
            total += int(t.n_elements)
    return total


def peaks(tool, threads):
    out = subprocess.run([str(tool), str(threads), "1"], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        unit, rest = line.split(" int8 peak: ")
        if rest.startswith("none"):
            continue
        found[unit] = float(rest.split(" GOPS")[0])
    return found


def print_kl(models, args, kl):
    """The fast tier's KL divergence from exact beside a q8_0 KV cache's, per model (Markdown)."""
    print(f"KL divergence per scored position ({args.chunks} windows of 512 tokens of {CORPUS.name}), "
          "against exact numerics with an f16 KV cache:")
    print()
    print("| model | fast numerics, f16 KV: mean KL | 99% | same top | exact numerics, q8_0 KV: mean KL | 99% | "
          "same top |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        f = kl(model, ["--numerics", "fast"])
        q = kl(model, ["--kv-cache-dtype", "q8_0"])
        print(f"| {model.name} | {f['kl_divergence_mean']:.6f} | {f['kl_divergence_p99']:.6f} | {f['same_top']:.1%} | "
              f"{q['kl_divergence_mean']:.6f} | {q['kl_divergence_p99']:.6f} | {q['same_top']:.1%} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(str(MODEL_DIR / m) for m in (
        "SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=8, help="perplexity windows of 512 tokens for the KL figures")
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--peak-tool", default=str(ROOT / "build" / "int8_peak"))
    ap.add_argument("--old", default="", help="an older inferd binary whose fast tier runs beside (A/B)")
    ap.add_argument("--kl-only", action="store_true", help="print the KL divergence table only")
    args = ap.parse_args()
    models = [Path(m) for m in args.models.split(",")]
    have_llama = LLAMA_BENCH.exists()

    def inferd_pp(model, prompt, numerics, binary=None):
        out = subprocess.run([binary or args.inferd, "generate", "-m", str(model), "-p", prompt, "-n", "1", "--temp", "0",
                              "--ignore-eos", "--json", "-t", str(args.threads), "-c", "2048", "--numerics", numerics],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)["timings"]
        return r["prompt_tokens"] / r["prompt_seconds"]

    def llama_pp(model):
        out = subprocess.run([str(LLAMA_BENCH), "-m", str(model), "-t", str(args.threads), "-p", "512", "-n", "0",
                              "-r", "1", "-o", "json"], check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["avg_ts"]

    def kl(model, extra):
        out = subprocess.run([args.inferd, "perplexity", "-m", str(model), "-f", str(CORPUS), "-c", "512", "-b", "512",
                              "--chunks", str(args.chunks), "--kl-divergence", "--json", "-t", str(args.threads)]
                             + extra, check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    if args.kl_only:
        print_kl(models, args, kl)
        return
    peak_before = peaks(args.peak_tool, args.threads)
    rows = []
    for model in models:
        prompt = prompt_of(args.inferd, model, 512, args.threads)
        n_prompt = len(inferd_json(args.inferd, model, prompt, 0, args.threads)["prompt_ids"])
        runs = {"exact": [], "old fast": [], "fast": [], "llama.cpp": []}
        for _ in range(args.reps):
            if have_llama:
                runs["llama.cpp"].append(llama_pp(model))
            runs["exact"].append(inferd_pp(model, prompt, "exact"))
            if args.old:
                runs["old fast"].append(inferd_pp(model, prompt, "fast", args.old))
            runs["fast"].append(inferd_pp(model, prompt, "fast"))
        rows.append((model, n_prompt, {k: statistics.median(v) for k, v in runs.items() if v},
                     projection_elements(model)))
    peak_after = peaks(args.peak_tool, args.threads)
    peak = {u: (peak_before[u] + peak_after.get(u, peak_before[u])) / 2 for u in peak_before}

    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; threads {args.threads}; {args.reps} repetitions each, "
          f"alternating (median).")
    print("int8 peak: " + ", ".join(f"{u.upper()} {peak_before[u]:.0f} GOPS before, {peak_after.get(u, 0):.0f} after"
                                    for u in peak_before) + ("; no AMX" if "amx" not in peak else ""))
    print()
    units = sorted(peak)
    print("| model | engine | pp tok/s | projection GOPS | " + " | ".join(f"share of {u.upper()} peak" for u in units)
          + " | / llama.cpp |")
    print("|---|---|---|---|" + "---|" * len(units) + "---|")
    for model, n_prompt, pp, elements in rows:
        for engine in ("llama.cpp", "exact", "old fast", "fast"):
            if engine not in pp:
                continue
            gops = 2 * elements * pp[engine] / 1e9
            ratio = f"{pp[engine] / pp['llama.cpp']:.2f}" if "llama.cpp" in pp else "-"
            label = engine if engine == "llama.cpp" else f"inferd {engine}"
            print(f"| {model.name} ({n_prompt} tokens) | {label} | {pp[engine]:.1f} | {gops:.1f} | "
                  + " | ".join(f"{gops / peak[u]:.1%}" for u in units) + f" | {ratio} |")
    print()
    print_kl([model for model, _, _, _ in rows], args, kl)


if __name__ == "__main__":
    sys.exit(main())
