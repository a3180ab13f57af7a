#!/usr/bin/env python3
"""Single-stream speed of inferd beside llama.cpp's llama-bench, same model, same
machine, same thread count, in one run.

  prompt processing: a 512-token prompt from an empty cache (llama-bench pp512)
  decode:            128 tokens after a 1-token prompt      (llama-bench tg128)

  floor:             read bandwidth of a buffer the size of the weights a
                     decode step reads (every tensor but an untied token-
                     embedding table; build/memory_bandwidth, its best pass),
                     measured just before and after each decode run; decode
                     tokens/s at that bandwidth if a step read only the
                     weights, once. The share of the median pass is printed
                     too, as context: it is not the floor.

Usage: bench/compare_llama_bench.py [--model PATH] [--threads N] [--reps 3]
         [--prompt-tokens 512,2048,8192] [--flash-attn 0,1] [--old OLD_INFERD] [--no-decode]
         [--numerics exact|fast]
  --prompt-tokens: prompt lengths (llama-bench -p N; inferd a natural-text prompt of at most N tokens)
  --flash-attn:    llama-bench -fa settings, each its own column
  --old:           a second inferd build, alternating with --inferd in the prompt runs (new / old ratio)
llama.cpp is built natively from the llama-cpp-python source package by
bench/build_llama_cpp.sh (into ~/.cache/inferd/llama.cpp) if it is not there yet.
Prints a Markdown table for docs/benchmarks.md. Decode on a shared VM moves
with the host's load, so compare only figures from the same run.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("INFERD_CACHE", Path.home() / ".cache" / "inferd"))
MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", CACHE / "models"))


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


# Flags every inferd run takes (--numerics: main() sets it).
INFERD_FLAGS: list[str] = []


def inferd_json(binary, model, prompt, n, threads, ctx=2048):
    out = subprocess.run([str(binary), "generate", "-m", str(model), "-p", prompt, "-n", str(n),
                          "--temp", "0", "--ignore-eos", "--json", "-t", str(threads), "-c", str(ctx),
                          *INFERD_FLAGS],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def prompt_of(binary, model, n_tokens, threads):
    """The longest natural-text prompt of at most n_tokens tokens (by inferd's
    tokenizer, which matches llama.cpp's), found by bisecting on its word count.
    Beyond 1,024 tokens the counts come from short texts: the text repeats every
    len(words) words and so does its tokenization, so a count is a short text's
    plus whole repetitions (no prefill of tens of thousands of tokens per step);
    the text found is counted once in full to check."""
    words = ("The history of science is the study of how people came to understand the natural "
             "world, from early astronomy and medicine to modern physics and biology.").split()
    text_of = lambda k: " ".join(words[i % len(words)] for i in range(k))
    # A context that takes the bisection's longest text (about 4 tokens a word at most).
    count = lambda k: len(inferd_json(binary, model, text_of(k), 0, threads, max(2048, 16 * n_tokens))["prompt_ids"])
    if n_tokens > 1024:
        period, base, known = len(words), 2 * len(words), {}
        def short(k):
            if k not in known:
                known[k] = len(inferd_json(binary, model, text_of(k), 0, threads)["prompt_ids"])
            return known[k]
        per = short(base + period) - short(base)
        full = lambda k: len(inferd_json(binary, model, text_of(k), 0, threads, n_tokens + 64)["prompt_ids"])
        count = lambda k: short(k) if k < base else short(base + (k - base) % period) + (k - base) // period * per
    lo, hi = 1, 4 * n_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(mid) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    if n_tokens > 1024:
        assert full(lo) == count(lo), f"{full(lo)} tokens, not the {count(lo)} extrapolated"
    return text_of(lo)


def decode_bytes(path):
    """The weight bytes one decode step reads: every tensor, except a token-embedding table beside an output
    matrix of its own (untied: a step reads one row of it). The file size when the gguf package is missing."""
    try:
        import gguf
    except ImportError:
        return Path(path).stat().st_size
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    untied = tensors.get("token_embd.weight", 0) if "output.weight" in tensors else 0
    return sum(tensors.values()) - untied


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--old", help="another inferd binary (an older build): its prompt runs alternate with --inferd's")
    ap.add_argument("--prompt-tokens", default="512", help="prompt lengths, comma-separated (e.g. 512,2048,8192)")
    ap.add_argument("--flash-attn", default="",
                    help="llama-bench -fa values, comma-separated (e.g. 0,1); empty: llama-bench's default")
    ap.add_argument("--no-decode", action="store_true", help="prompt processing only")
    ap.add_argument("--bandwidth-tool", default=str(ROOT / "build" / "memory_bandwidth"))
    ap.add_argument("--numerics", choices=["exact", "fast"], help="inferd's numerics tier (default: its own default)")
    args = ap.parse_args()
    if args.numerics:
        INFERD_FLAGS[:] = ["--numerics", args.numerics]
    model_bytes = decode_bytes(args.model)
    lengths = [int(n) for n in args.prompt_tokens.split(",")]
    fa_values = [f for f in args.flash_attn.split(",") if f != ""] or [None]

    def bandwidth():
        """GB/s reading a buffer the size of the model: the best pass (the floor) and the median pass (the tool
        prints 'read bandwidth: X GB/s (... median pass: Y GB/s; ...)')."""
        mib = max(1, round(model_bytes / 2**20))
        out = subprocess.run([args.bandwidth_tool, str(args.threads), str(mib)], check=True, capture_output=True,
                             text=True).stdout
        return (float(out.split("read bandwidth:")[1].split("GB/s")[0]),
                float(out.split("median pass:")[1].split("GB/s")[0]))

    subprocess.run([str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)
    llama_bench = CACHE / "llama.cpp" / "build" / "bin" / "llama-bench"

    def llama(n_prompt, n_gen, fa=None):
        out = subprocess.run([str(llama_bench), "-m", args.model, "-t", str(args.threads), "-p", str(n_prompt),
                              "-n", str(n_gen), "-r", "1", "-o", "json"] + (["-fa", fa] if fa is not None else []),
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["avg_ts"]

    def inferd_pp(binary, prompt, n):
        r = inferd_json(binary, args.model, prompt, 1, args.threads, max(2048, n + 64))["timings"]
        return r["prompt_tokens"] / r["prompt_seconds"]

    # Prompt processing: per repetition and length, each llama-bench -fa
    # setting and each inferd binary once, one after another.
    engines = [("llama", fa) for fa in fa_values] + ([("old", None)] if args.old else []) + [("inferd", None)]
    prompts = {n: prompt_of(args.inferd, args.model, n, args.threads) for n in lengths}
    n_prompt = {n: len(inferd_json(args.inferd, args.model, prompts[n], 0, args.threads, max(2048, n + 64))
                       ["prompt_ids"]) for n in lengths}
    pp = {(n, e): [] for n in lengths for e in engines}
    for _ in range(args.reps):
        for n in lengths:
            for e in engines:
                kind, fa = e
                pp[(n, e)].append(llama(n, 0, fa) if kind == "llama"
                                  else inferd_pp(args.old if kind == "old" else args.inferd, prompts[n], n))

    # The host's load moves the bandwidth within seconds, so each decode run
    # sits between two bandwidth readings and is compared with their mean;
    # the engines alternate, one run each per repetition.
    tg = {"llama": [], "inferd": []}
    share = {"llama": [], "inferd": []}
    bw_all = []
    runs = []  # (inferd's share, the bandwidth it was compared with)
    median_share = []  # inferd's share of the median-pass bandwidth
    for _ in range(0 if args.no_decode else args.reps):
        for engine in ("llama", "inferd"):
            before = bandwidth()
            if engine == "llama":
                rate = llama(0, 128)
            else:
                r = inferd_json(args.inferd, args.model, "Hello", 129, args.threads)["timings"]
                # The first sampled token comes from the prompt pass; 128 decode steps follow.
                rate = (r["generated_tokens"] - 1) / r["decode_seconds"]
            after = bandwidth()
            floor = (before[0] + after[0]) / 2 * 1e9 / model_bytes
            tg[engine].append(rate)
            share[engine].append(rate / floor)
            bw_all += [before[0], after[0]]
            if engine == "inferd":
                runs.append((rate / floor, (before[0] + after[0]) / 2))
                median_share.append(rate / ((before[1] + after[1]) / 2 * 1e9 / model_bytes))

    med = statistics.median
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; threads {args.threads}; "
          f"model {Path(args.model).name}; {args.reps} repetitions each, alternating (median).")
    print()
    name = lambda e: (f"llama.cpp -fa {e[1]}" if e[1] is not None else "llama.cpp") if e[0] == "llama" else \
        ("inferd (old)" if e[0] == "old" else "inferd")
    llamas = [e for e in engines if e[0] == "llama"]
    print("| test | " + " | ".join(f"{name(e)} (tok/s)" for e in engines) + " | "
          + " | ".join(f"inferd / {name(e)}" for e in llamas) + (" | inferd / inferd (old) |" if args.old else " |"))
    print("|---|" + "---|" * (len(engines) + len(llamas) + (1 if args.old else 0)))
    for n in lengths:
        m = {e: med(pp[(n, e)]) for e in engines}
        cells = [f"{m[e]:.1f}" for e in engines] + [f"{m[('inferd', None)] / m[e]:.2f}" for e in llamas]
        if args.old:
            cells.append(f"{m[('inferd', None)] / m[('old', None)]:.3f}")
        print(f"| prompt {n_prompt[n]} tokens (pp{n}) | " + " | ".join(cells) + " |")
    if args.no_decode:
        return
    print(f"| decode 128 tokens (tg128) | {med(tg['llama']):.1f} | {med(tg['inferd']):.1f} | "
          f"{med(tg['inferd']) / med(tg['llama']):.2f} |")
    print()
    print(f"Bandwidth floor: reading {model_bytes / 2**20:.0f} MiB took {min(bw_all):.1f} to {max(bw_all):.1f} GB/s "
          f"(median {med(bw_all):.1f}) over the run; against the readings just before and after each of its runs, "
          f"llama.cpp decodes at {med(share['llama']):.0%} of the floor, inferd at {med(share['inferd']):.0%} "
          f"(per run: {', '.join(f'{x:.0%} at {b:.0f} GB/s' for x, b in runs)}). Against the median pass of the "
          f"same readings instead of the best, inferd decodes at {med(median_share):.0%}.")


if __name__ == "__main__":
    sys.exit(main())
