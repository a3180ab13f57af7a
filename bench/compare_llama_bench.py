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


def inferd_json(binary, model, prompt, n, threads, ctx=2048):
    out = subprocess.run([str(binary), "generate", "-m", str(model), "-p", prompt, "-n", str(n),
                          "--temp", "0", "--ignore-eos", "--json", "-t", str(threads), "-c", str(ctx)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def prompt_of(binary, model, n_tokens, threads):
    """The longest natural-text prompt of at most n_tokens tokens (by inferd's
    tokenizer, which matches llama.cpp's), found by bisecting on its word count."""
    words = ("The history of science is the study of how people came to understand the natural "
             "world, from early astronomy and medicine to modern physics and biology.").split()
    text_of = lambda k: " ".join(words[i % len(words)] for i in range(k))
    # A context that takes the bisection's longest text (about 4 tokens a word at most).
    count = lambda k: len(inferd_json(binary, model, text_of(k), 0, threads, max(2048, 16 * n_tokens))["prompt_ids"])
    lo, hi = 1, 4 * n_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(mid) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
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
    ap.add_argument("--bandwidth-tool", default=str(ROOT / "build" / "memory_bandwidth"))
    args = ap.parse_args()
    model_bytes = decode_bytes(args.model)

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

    def llama(n_prompt, n_gen):
        out = subprocess.run([str(llama_bench), "-m", args.model, "-t", str(args.threads), "-p", str(n_prompt),
                              "-n", str(n_gen), "-r", "1", "-o", "json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["avg_ts"]

    # The host's load moves the bandwidth within seconds, so each decode run
    # sits between two bandwidth readings and is compared with their mean;
    # the engines alternate, one run each per repetition.
    prompt = prompt_of(args.inferd, args.model, 512, args.threads)
    n_prompt = len(inferd_json(args.inferd, args.model, prompt, 0, args.threads)["prompt_ids"])
    pp = {"llama": [], "inferd": []}
    tg = {"llama": [], "inferd": []}
    share = {"llama": [], "inferd": []}
    bw_all = []
    runs = []  # (inferd's share, the bandwidth it was compared with)
    median_share = []  # inferd's share of the median-pass bandwidth
    for _ in range(args.reps):
        pp["llama"].append(llama(512, 0))
        r = inferd_json(args.inferd, args.model, prompt, 1, args.threads)["timings"]
        pp["inferd"].append(r["prompt_tokens"] / r["prompt_seconds"])
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
    print("| test | llama.cpp (tok/s) | inferd (tok/s) | inferd / llama.cpp |")
    print("|---|---|---|---|")
    print(f"| prompt {n_prompt} tokens (pp512) | {med(pp['llama']):.1f} | {med(pp['inferd']):.1f} | "
          f"{med(pp['inferd']) / med(pp['llama']):.2f} |")
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
