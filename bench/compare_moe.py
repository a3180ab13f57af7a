#!/usr/bin/env python3
"""Mixture-of-experts and hybrid (qwen35) models: inferd beside llama.cpp (llama-bench, llama-server), same model,
same machine, same threads, in one run (models from bench/make_synthetic_moe.py).

  prompt    a 512-token prompt from an empty cache (llama-bench pp512)
  decode    128 tokens after a 1-token prompt (llama-bench tg128)
            The engines alternate, one run each per repetition.
  floor     the bytes one decode step reads: attention weights, norms, the router, the chosen
            experts' share of the expert tensors (top-k of n_expert: n_expert_used / n_expert of
            ffn_{gate,up,down}_exps and their biases), the output head, one embedding row and the
            f16 keys and values at the run's mean context (sliding-window layers capped at the
            window; deepseek2's latent attention: the one latent + RoPE key row per token, keys
            only, as both engines cache it; for a hybrid (qwen35) the attention layers' keys and
            values only, and the Gated DeltaNet layers' recurrent state (f32 matrix and convolution
            window), read and written once per step); over the read bandwidth of a buffer of that
            size (build/memory_bandwidth,
            best pass), read just before and after each decode run. Decode tokens/s at that
            bandwidth if a step read those bytes once and did nothing else.
  memory    each process's peak resident set (wait4's ru_maxrss) beside the file size and the
            KV cache it was given.
  serving   --serving: 16 concurrent streams beside llama-server (bench/compare_serving.py
            --concurrency 16, random 128-token prompts, 128 output tokens each).

Usage: bench/compare_moe.py --model PATH [--tokenizer-model SMALL.gguf] [--threads 2] [--reps 3]
                            [--serving] [--num-prompts 32] [--skip-inferd] [--skip-single]
Prints Markdown for docs/benchmarks.md, with the load average before and after each part.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_bench as clb  # noqa: E402

ROOT, CACHE = clb.ROOT, clb.CACHE
LLAMA_BIN = CACHE / "llama.cpp" / "build" / "bin"


def loadavg():
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_measured(cmd):
    """(stdout, peak RSS MiB) of cmd, by os.wait4 on its pid."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks, err_chunks = [], []
    t = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()))
    t.start()
    chunks.append(proc.stdout.read())
    t.join()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err_chunks[0][-3000:].decode(errors='replace')}")
    return b"".join(chunks).decode(), ru.ru_maxrss / 1024, err_chunks[0].decode(errors="replace")


class StepBytes:
    """What one decode step reads, by part, from the GGUF's tensor table and hyperparameters."""

    def __init__(self, path):
        import gguf
        r = gguf.GGUFReader(path)
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        kv = lambda k, d=None: (r.fields[f"{arch}.{k}"].parts[-1].tolist()[0] if f"{arch}.{k}" in r.fields else d)
        self.arch = arch
        self.n_layer = kv("block_count") - kv("nextn_predict_layers", 0)  # a multi-token-prediction block is skipped
        self.n_expert, self.n_used = kv("expert_count"), kv("expert_used_count")
        self.n_kv, self.head_dim = kv("attention.head_count_kv"), kv("attention.key_length")
        self.window = kv("attention.sliding_window", 0)
        self.latent = kv("attention.kv_lora_rank", 0) > 0  # MLA: the cached row serves as key and value
        # Hybrid: every full_attention_interval-th layer attends, the others are Gated DeltaNet layers whose
        # f32 state (a value-head count of head x head matrices, and a conv_kernel - 1 window of the q, k, v
        # channels) is read and written once per step, as llama.cpp and inferd keep it.
        self.attn_interval = kv("full_attention_interval", 1)
        self.state_bytes = 0
        if kv("ssm.time_step_rank"):
            v_heads, head, groups = kv("ssm.time_step_rank"), kv("ssm.state_size"), kv("ssm.group_count")
            conv_channels = 2 * groups * head + v_heads * head
            per_layer = 4 * (v_heads * head * head + (kv("ssm.conv_kernel") - 1) * conv_channels)
            n_recurrent = sum(1 for il in range(self.n_layer) if (il + 1) % self.attn_interval != 0)
            self.state_bytes = 2 * n_recurrent * per_layer
        tensors = {t.name: int(t.n_bytes) for t in r.tensors}
        self.file_bytes = Path(path).stat().st_size
        self.parts = {"attention": 0, "router": 0, "experts (chosen)": 0, "dense FFN, shared experts": 0,
                      "norms, biases": 0, "output head": 0, "embedding row": 0}
        if self.state_bytes:
            self.parts["linear attention"] = 0
        self.all_experts = 0
        n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
        for name, n in tensors.items():
            if "_exps." in name:
                self.all_experts += n
                key = "experts (chosen)" if name.endswith(".weight") else "norms, biases"
                self.parts[key] += n * self.n_used / self.n_expert
            elif name == "token_embd.weight":
                if "output.weight" not in tensors:  # tied: the table is the output head too
                    self.parts["output head"] += n
                self.parts["embedding row"] += n / n_vocab
            elif name == "output.weight":
                self.parts["output head"] += n
            elif "ffn_gate_inp" in name:
                self.parts["router"] += n
            elif self.state_bytes and name.endswith(".weight") and any(
                    k in name for k in ("attn_qkv.", "attn_gate.", "ssm_alpha.", "ssm_beta.", "ssm_out.")):
                self.parts["linear attention"] += n
            elif name.endswith(".weight") and ".attn_" in name and "norm" not in name and "sinks" not in name:
                self.parts["attention"] += n  # also deepseek2's attn_q_a/q_b, attn_kv_a_mqa, attn_k_b, attn_v_b
            elif name.endswith(".weight") and (".ffn_gate" in name or ".ffn_up" in name or ".ffn_down" in name):
                self.parts["dense FFN, shared experts"] += n
            else:
                self.parts["norms, biases"] += n

    def kv_bytes(self, ctx):
        """f16 keys and values read by one step at context ctx (gpt-oss: a window on even layers; a hybrid:
        its attention layers only)."""
        total = 0
        for il in range(self.n_layer):
            if (il + 1) % self.attn_interval != 0:
                continue
            c = ctx
            if self.window and self.arch == "gpt-oss" and il % 2 == 0:
                c = min(ctx, self.window)
            total += (1 if self.latent else 2) * self.n_kv * self.head_dim * 2 * c
        return total

    def weights(self):
        return sum(self.parts.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--bandwidth-tool", default=str(ROOT / "build" / "memory_bandwidth"))
    ap.add_argument("--tokenizer-model", default="", help="a small GGUF with the same tokenizer, to size the prompt")
    ap.add_argument("--skip-single", action="store_true", help="serving only")
    ap.add_argument("--skip-inferd", action="store_true", help="llama.cpp only (e.g. an architecture inferd lacks)")
    ap.add_argument("--serving", action="store_true")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or CACHE / "bench" / f"moe-{Path(args.model).stem}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    sb = StepBytes(args.model)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    med = statistics.median
    shape = f"{sb.n_used} of {sb.n_expert} experts" if sb.n_expert else (
        f"every {sb.attn_interval}th layer attention" if sb.state_bytes else "dense")
    lines = [f"Machine: {clb.cpu_name()}, {os.cpu_count()} cores; threads {args.threads}; inferd {commit}; "
             f"model {Path(args.model).name} ({sb.file_bytes / 2**30:.2f} GiB, {sb.n_layer} layers, "
             f"{shape}); started {stamp}, load average {loadavg():.2f}."]
    record = {"model": args.model, "commit": commit, "parts": sb.parts, "file_bytes": sb.file_bytes}

    if not args.skip_single:
        # tg128 after a 1-token prompt: steps attend to 2..129 positions, 65.5 on average.
        mean_ctx = 65.5
        step = sb.weights() + sb.kv_bytes(mean_ctx) + sb.state_bytes
        record["step_bytes"] = step

        def bandwidth():
            mib = max(1, round(step / 2**20))
            o = subprocess.run([args.bandwidth_tool, str(args.threads), str(mib)], check=True, capture_output=True,
                               text=True).stdout
            return float(o.split("read bandwidth:")[1].split("GB/s")[0]), float(o.split("median pass:")[1].split("GB/s")[0])

        def llama(n_prompt, n_gen):
            o, rss, _ = run_measured([str(LLAMA_BIN / "llama-bench"), "-m", args.model, "-t", str(args.threads),
                                      "-p", str(n_prompt), "-n", str(n_gen), "-r", "1", "-o", "json"])
            return json.loads(o)[0]["avg_ts"], rss

        def inferd(prompt, n, seed=0):
            # Decode samples (temperature 1, top-k 40) so that each step's token, and with it the experts chosen,
            # changes from step to step as llama-bench's random tokens do: random weights make greedy decoding
            # repeat one token, whose experts would then stay in the caches. The sampling is inferd's cost only.
            # Without experts every step reads every weight whatever the token: greedy, no sampling cost.
            temp = ["--temp", "1", "--top-k", "40"] if sb.n_expert else ["--temp", "0"]
            o, rss, err = run_measured([args.inferd, "generate", "-m", args.model, "-p", prompt, "-n", str(n),
                                        *temp, "--seed", str(seed), "--ignore-eos",
                                        "--json", "-t", str(args.threads), "-c", "2048"])
            return json.loads(o), rss, err

        engines = ["llama"] + ([] if args.skip_inferd else ["inferd"])
        if not args.skip_inferd:
            # The prompt is found with a small model of the same tokenizer: each load of the big one repacks GBs.
            tok = args.tokenizer_model or args.model
            prompt = clb.prompt_of(args.inferd, tok, 512, args.threads)
            n_prompt = len(clb.inferd_json(args.inferd, tok, prompt, 0, args.threads)["prompt_ids"])
        else:
            n_prompt = 512
        pp = {e: [] for e in engines}
        tg = {e: [] for e in engines}
        share = {e: [] for e in engines}
        rss = {e: [] for e in engines}
        bw_all, loads = [], [loadavg()]
        diversity = []
        for rep in range(args.reps):
            for e in engines:
                if e == "llama":
                    rate, m = llama(512, 0)
                else:
                    j, m, _ = inferd(prompt, 1)
                    rate = j["timings"]["prompt_tokens"] / j["timings"]["prompt_seconds"]
                    assert j["timings"]["prompt_tokens"] == n_prompt
                pp[e].append(rate)
                rss[e].append(m)
            for e in engines:
                before = bandwidth()
                if e == "llama":
                    rate, m = llama(0, 128)
                else:
                    j, m, err = inferd("Hello", 129, seed=rep + 1)
                    r = j["timings"]
                    rate = (r["generated_tokens"] - 1) / r["decode_seconds"]
                    ids = j.get("ids") or j.get("output_ids") or j.get("generated_ids") or []
                    if ids and sb.n_expert:
                        diversity.append(len(set(ids)))
                    if rep == 0:
                        (out / "inferd-generate.stderr").write_text(err)
                after = bandwidth()
                floor = (before[0] + after[0]) / 2 * 1e9 / step
                tg[e].append(rate)
                share[e].append(rate / floor)
                rss[e].append(m)
                bw_all += [before[0], after[0]]
            loads.append(loadavg())
            print(f"rep {rep}: pp {[round(pp[e][-1], 2) for e in engines]} tg {[round(tg[e][-1], 2) for e in engines]}"
                  f" load {loads[-1]}", file=sys.stderr, flush=True)
        bw = med(bw_all)
        record.update(pp=pp, tg=tg, share=share, rss=rss, bandwidth=bw_all, loads=loads, diversity=diversity)
        lines += ["", f"Load average (1 min) over the single-stream part: {min(loads):.2f} to {max(loads):.2f}.", "",
                  "| test | llama.cpp (tok/s) | inferd (tok/s) | inferd / llama.cpp |", "|---|---:|---:|---:|"]
        get = lambda d, e: med(d[e]) if d.get(e) else float("nan")
        lines.append(f"| prompt {n_prompt} tokens (pp512) | {get(pp, 'llama'):.2f} | {get(pp, 'inferd'):.2f} | "
                     f"{get(pp, 'inferd') / get(pp, 'llama'):.2f} |")
        lines.append(f"| decode 128 tokens (tg128) | {get(tg, 'llama'):.2f} | {get(tg, 'inferd'):.2f} | "
                     f"{get(tg, 'inferd') / get(tg, 'llama'):.2f} |")
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sb.parts.items() if v)
        lines += ["", f"Decode floor: a step reads {step / 2**20:.0f} MiB ({parts}; keys and values at "
                  f"{mean_ctx} positions {sb.kv_bytes(mean_ctx) / 2**20:.1f} MiB; "
                  + (f"recurrent state read and written {sb.state_bytes / 2**20:.1f} MiB; " if sb.state_bytes else "")
                  + (f"all experts would be {sb.all_experts / 2**20:.0f} MiB" if sb.n_expert else "no experts")
                  + f"). Reading that many bytes took {min(bw_all):.1f} to "
                  f"{max(bw_all):.1f} GB/s (median {bw:.1f}), a floor of {bw * 1e9 / step:.1f} tok/s; against the "
                  f"readings around each run llama.cpp decodes at {get(share, 'llama'):.0%} of the floor, inferd at "
                  f"{get(share, 'inferd'):.0%} (per run: {', '.join(f'{x:.0%}' for x in share.get('inferd', []))})."]
        kv_ctx = 2048
        lines += ["", f"Peak resident memory (MiB; file {sb.file_bytes / 2**20:.0f}): llama-bench "
                  f"{max(rss['llama']):.0f}" + ("" if args.skip_inferd else
                                               f", inferd generate (-c {kv_ctx}) {max(rss['inferd']):.0f}") + "."]
        if diversity:
            lines.append(f"inferd's sampled continuations held {min(diversity)}-{max(diversity)} distinct tokens of 129.")

    if args.serving and not args.skip_inferd:
        sdir = out / "serving"
        l0 = loadavg()
        subprocess.run([sys.executable, str(ROOT / "bench" / "compare_serving.py"), "--model", args.model,
                        "--threads", str(args.threads), "--concurrency", "16", "--num-prompts", str(args.num_prompts),
                        "--skip-openai-client", "--skip-single-stream", "--skip-prefix", "--inferd", args.inferd,
                        "--out", str(sdir)], check=True)
        s = json.loads((sdir / "summary.json").read_text())["concurrency"]["16"]
        lt = s["llama.cpp"]["inferd bench serve"]["output_throughput"]
        it = s["inferd"]["inferd bench serve"]["output_throughput"]
        record["serving"] = {"llama": lt, "inferd": it, "load": [l0, loadavg()]}
        lines += ["", f"16 streams ({args.num_prompts} requests, 128 tokens in, 128 out; load {l0:.2f} before, "
                  f"{loadavg():.2f} after): llama-server {lt:.2f}, inferd {it:.2f} output tok/s, **{it / lt:.2f}x**."]

    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    (out / "record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(text)
    print(f"(wrote {out})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
