#!/usr/bin/env python3
"""Embeddings per second: `inferd serve` beside llama.cpp's `llama-server
--embedding`, same GGUF (all-MiniLM-L6-v2 by default), same threads, same
client, same sentences, one server at a time.

Sentences: --sentences (1000) word windows of 8-40 words cut at seeded random
places from the committed tests/data/text/perplexity_corpus.txt (it holds only
~180 sentences, too few to split into 1000; windows of real text are what a
sentence-embedding workload looks like, and the seed makes them the same on
every run and for both servers).

Client (stdlib http.client, identical for both servers): the sentences in
requests of --batch inputs to /v1/embeddings (encoding_format float), at most
--concurrency requests in flight. A pass sends every sentence once; its
sentences/s is the number of sentences over the pass's wall time (first
request sent to last response read).

Servers, equal where they can be: --threads for both (llama-server -t and
-tb); the same number of sequences at once (inferd --max-num-seqs, llama-server
-np, both --batch x --concurrency, so every input in flight has a slot); the
same tokens per engine step (inferd --max-num-batched-tokens, llama-server
-b/-ub: llama-server needs a whole input in one ubatch for a non-causal model);
512 tokens per sequence (the model's context; llama-server -c = slots x 512).
Pooling is left to each server, which reads it from the GGUF (mean for
all-MiniLM-L6-v2); both normalise (L2) the vectors of /v1/embeddings.

Repetitions are interleaved, the server order alternating (inferd, llama.cpp,
llama.cpp, inferd, ...): each time a server starts, gets an untimed warm-up
(the first 2 x batch x concurrency sentences), then one timed pass, and stops. Checks, so that the two figures are for
the same work: every vector of every timed pass is compared with the other
server's vector of the same sentence (cosine, at least --min-cosine), and the
prompt tokens each server reports (usage.prompt_tokens) are compared too.

Writes summary.json, results.md and the server logs into --out; prints the
Markdown table.

Usage: bench/compare_embeddings.py [--threads 2] [--reps 3] [--batch 32] [--concurrency 4]
                                   [--model PATH] [--inferd build/inferd] [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import http.client
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare_serving as cs  # noqa: E402  (Server, free_port, cpu_name)

ROOT, CACHE, MODEL_DIR, LLAMA_BIN = cs.ROOT, cs.CACHE, cs.MODEL_DIR, cs.LLAMA_BIN
SERVED_NAME = "bench-embed"
MODEL_CTX = 512  # all-MiniLM-L6-v2's context (bert.context_length)




def log(msg: str) -> None:
    print(f"[compare_embeddings] {msg}", flush=True)


cs.log = log


def sentences(n: int, seed: int) -> list[str]:
    words = (ROOT / "tests" / "data" / "text" / "perplexity_corpus.txt").read_text().split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(8, 40)
        start = rng.randrange(len(words) - length)
        out.append(" ".join(words[start:start + length]))
    return out


def embed(base_url: str, inputs: list[str], timeout: float = 600) -> tuple[list[list[float]], int]:
    """One /v1/embeddings request: (vectors in input order, usage.prompt_tokens)."""
    host, port = base_url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        body = {"model": SERVED_NAME, "input": inputs, "encoding_format": "float"}
        conn.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{base_url}/v1/embeddings answered {resp.status}: {raw[:300]!r}")
        data = json.loads(raw)
    finally:
        conn.close()
    vectors: list[list[float] | None] = [None] * len(inputs)
    for item in data["data"]:
        vectors[item["index"]] = item["embedding"]
    if any(v is None for v in vectors):
        raise RuntimeError(f"{base_url} returned {len(data['data'])} vectors for {len(inputs)} inputs")
    return vectors, int((data.get("usage") or {}).get("prompt_tokens", 0))


def one_pass(base_url: str, texts: list[str], batch: int, concurrency: int) -> dict:
    """Every sentence once, in requests of `batch`, `concurrency` in flight."""
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    vectors: list[list[float]] = []
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda b: embed(base_url, b), batches))
    wall = time.perf_counter() - t0
    tokens = 0
    for vecs, toks in results:
        vectors.extend(vecs)
        tokens += toks
    return {"wall_s": wall, "sentences": len(texts), "sentences_per_s": len(texts) / wall,
            "prompt_tokens": tokens, "tokens_per_s": tokens / wall, "vectors": vectors}


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def llama_loadable(src: Path, out_dir: Path) -> Path:
    """src, or a copy of it that llama.cpp can run: the same file with token_types.weight in F32.

    llama.cpp's BERT graph adds a row of token_types to F32 activations, and its CPU add has no
    F32 + F16 kernel (it aborts: "binary_op: unsupported types"); its own converter always writes
    that tensor in F32. F16 -> F32 is exact, so the copy holds the same numbers, and both servers
    are given the copy: the same file for both."""
    import numpy as np
    import gguf

    reader = gguf.GGUFReader(src)
    convert = {t.name for t in reader.tensors
               if t.name == "token_types.weight" and t.tensor_type == gguf.GGMLQuantizationType.F16}
    if not convert:
        return src
    dst = out_dir / (src.stem + ".token-types-f32.gguf")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    datas = []
    for t in reader.tensors:
        if t.name in convert:
            data = np.asarray(t.data, dtype=np.float16).astype(np.float32)
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType.F32)
        else:
            data = t.data
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
        datas.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in datas:
        writer.write_tensor_data(data)
    writer.close()
    log(f"{src.name}: {', '.join(sorted(convert))} F16 -> F32 for llama.cpp, in {dst} (both servers load it)")
    return dst


def inferd_server(a, out: Path, tag: str) -> cs.Server:
    port = cs.free_port()
    args = [a.inferd, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED_NAME, "--threads", str(a.threads),
            "--max-num-seqs", str(a.batch * a.concurrency), "--max-num-batched-tokens", str(a.step_tokens),
            "--max-model-len", str(MODEL_CTX), "--max-queued-requests", "100000", "--no-webui",
            "--numerics", a.numerics]
    return cs.Server(f"inferd serve ({tag})", args, port, out / f"server-inferd-{tag}.log")


def llama_server(a, out: Path, tag: str) -> cs.Server:
    port = cs.free_port()
    slots = a.batch * a.concurrency
    args = [str(LLAMA_BIN / "llama-server"), "-m", a.model, "--embedding", "-t", str(a.threads),
            "-tb", str(a.threads), "-np", str(slots), "-c", str(slots * MODEL_CTX),
            "-b", str(a.step_tokens), "-ub", str(a.step_tokens), "-cb", "--host", "127.0.0.1",
            "--port", str(port), "-a", SERVED_NAME, "--no-webui"]
    return cs.Server(f"llama-server ({tag})", args, port, out / f"server-llama-{tag}.log")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL_DIR / "all-MiniLM-L6-v2.f16.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32, help="inputs per request")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    ap.add_argument("--step-tokens", type=int, default=2048,
                    help="tokens per engine step on both servers (inferd --max-num-batched-tokens, llama -b/-ub)")
    ap.add_argument("--reps", type=int, default=3, help="timed passes per server, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--inferd", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--numerics", default="exact", choices=["exact", "fast"],
                    help="inferd's numerics tier (fast: F16 weights through the BF16 product)")
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true", help="100 sentences, 1 rep: checks the pipeline only")
    a = ap.parse_args()
    if a.quick:
        a.sentences, a.reps = 100, 1
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(a.out or CACHE / "bench" / f"embeddings-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    if not (LLAMA_BIN / "llama-server").exists():
        subprocess.run([str(ROOT / "bench" / "build_llama_cpp.sh")], check=True)

    texts = sentences(a.sentences, a.seed)
    a.source_model = a.model
    a.model = str(llama_loadable(Path(a.model), out))
    if not Path(a.inferd).is_file():
        sys.exit(f"{a.inferd} not found: build inferd first (scripts/setup.sh) or pass --inferd")
    commit = cs.binary_commit(a.inferd)
    llama_version = subprocess.run([str(LLAMA_BIN / "llama-server"), "--version"], capture_output=True,
                                   text=True)
    llama_version = (llama_version.stdout + llama_version.stderr).strip().splitlines()[0]
    makers = {"inferd": inferd_server, "llama.cpp": llama_server}
    runs: dict[str, list[dict]] = {"inferd": [], "llama.cpp": []}
    last_vectors: dict[str, list[list[float]]] = {}
    loads = []
    for rep in range(a.reps):
        # inferd, llama.cpp, llama.cpp, inferd, ...: a drift in the machine's load hits both alike.
        order = ["inferd", "llama.cpp"] if rep % 2 == 0 else ["llama.cpp", "inferd"]
        for name in order:
            with makers[name](a, out, f"{rep}") as srv:
                # Warm-up, untimed: two waves of full requests (threads, buffers and pages warm).
                one_pass(srv.base_url, texts[:2 * a.batch * a.concurrency], a.batch, a.concurrency)
                load_before = os.getloadavg()[0]
                r = one_pass(srv.base_url, texts, a.batch, a.concurrency)
                r["load_1min_before"], r["load_1min_after"] = load_before, os.getloadavg()[0]
            loads += [r["load_1min_before"], r["load_1min_after"]]
            if name in last_vectors and len(last_vectors[name]) == len(r["vectors"]):
                # Same server, same input, another pass: vectors should not depend on what was batched with them.
                r["min_cosine_to_own_previous_pass"] = min(
                    cosine(x, y) for x, y in zip(last_vectors[name], r["vectors"]))
            last_vectors[name] = r.pop("vectors")
            runs[name].append(r)
            log(f"rep {rep} {name}: {r['sentences_per_s']:.1f} sentences/s ({r['wall_s']:.2f} s, "
                f"{r['prompt_tokens']} prompt tokens, load {r['load_1min_before']:.2f})")

    cos = [cosine(x, y) for x, y in zip(last_vectors["inferd"], last_vectors["llama.cpp"])]
    below = [i for i, c in enumerate(cos) if c < a.min_cosine]
    tokens = {name: sorted({r["prompt_tokens"] for r in rs}) for name, rs in runs.items()}
    med = {name: statistics.median(r["sentences_per_s"] for r in rs) for name, rs in runs.items()}
    pair = [i["sentences_per_s"] / l["sentences_per_s"] for i, l in zip(runs["inferd"], runs["llama.cpp"])]
    summary = {
        "date_utc": stamp, "machine": f"{cs.cpu_name()}, {os.cpu_count()} cores", "inferd_commit": commit,
        "llama_cpp": llama_version, "config": vars(a), "sentences_words_mean": statistics.mean(
            len(t.split()) for t in texts),
        "runs": runs, "median_sentences_per_s": med, "ratio_inferd_over_llama": med["inferd"] / med["llama.cpp"],
        "pair_ratios": pair, "prompt_tokens": tokens,
        "cosine_min": min(cos), "cosine_median": statistics.median(cos), "cosine_below_min": len(below),
        "load_1min_range": [min(loads), max(loads)],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    lines = [
        f"Machine: {summary['machine']}; threads {a.threads} each; {Path(a.model).name}; {a.sentences} sentences "
        f"(mean {summary['sentences_words_mean']:.1f} words), {a.batch} per request, {a.concurrency} requests "
        f"in flight; inferd {commit}; llama-server {llama_version}; {stamp} UTC; load (1 min) "
        f"{min(loads):.2f}-{max(loads):.2f}.", "",
        "| server | sentences/s per pass | median sentences/s | prompt tokens / pass | median tokens/s |",
        "|---|---|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        per = ", ".join(f"{r['sentences_per_s']:.1f}" for r in rs)
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        lines.append(f"| {name} | {per} | {med[name]:.1f} | {'/'.join(map(str, tokens[name]))} | {tps:.0f} |")
    lines += ["", f"inferd / llama.cpp: **{summary['ratio_inferd_over_llama']:.2f}x** (medians); pair ratios "
              f"{', '.join(f'{p:.2f}' for p in pair)}.",
              f"Vectors, inferd against llama.cpp, all {len(cos)} sentences of the last passes: cosine min "
              f"{min(cos):.6f}, median {statistics.median(cos):.6f}; {len(below)} below {a.min_cosine}."]
    own = [r.get("min_cosine_to_own_previous_pass") for rs in runs.values() for r in rs]
    own = [c for c in own if c is not None]
    if own:
        lines.append(f"Each server against its own previous pass (other batch neighbours): cosine min {min(own):.6f}.")
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table)
    print(table)
    log(f"wrote {out / 'results.md'} and {out / 'summary.json'}")
    if below or tokens["inferd"] != tokens["llama.cpp"]:
        log("WARNING: the servers disagree (vectors below the cosine floor or different token counts): "
            "the comparison is not of the same work")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
