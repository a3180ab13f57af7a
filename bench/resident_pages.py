#!/usr/bin/env python3
"""Where each rank's resident memory goes once a model is loaded (issue 40's memory row, taken apart).

Runs `inferd bench latency` as one process or as two ranks (tensor or pipeline parallel), waits until
every rank's resident set stops changing (loaded, decoding), and prints per rank: its peak (VmHWM),
its resident set split into anonymous memory and file pages, the largest mappings, and which of the
GGUF file's tensors have pages mapped (from /proc/<pid>/pagemap, so it needs root). Every repacked
weight's file pages should be gone; what stays is the embedding rows the lookups read, the small
tensors read in place (norms, biases) and, around each read, the window Linux's fault-around maps.

Usage: bench/resident_pages.py one|tensor|pipeline [--model PATH] [--kv-blocks 341]
(every process and rank keeps --kv-blocks KV blocks, as in compare_parallel.py: the same tokens).
Not a timing: it can run beside other work.
"""
from __future__ import annotations

import argparse
import collections
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_parallel import DEFAULT_MODEL, MPI_ENV, MPIRUN, ROOT, inferd_pids, KV_BLOCKS  # noqa: E402

PAGE = 4096


def tensor_ranges(model: Path) -> list[tuple[int, int, str]]:
    import gguf  # the gguf package (setup.sh's reference tools install it)
    reader = gguf.GGUFReader(str(model))
    out = []
    for t in reader.tensors:
        kind = t.name.split(".", 2)[2] if t.name.startswith("blk.") else t.name
        out.append((int(t.data_offset), int(t.data_offset + t.n_bytes), f"{kind} ({t.tensor_type.name})"))
    return sorted(out)


def status(pid: int, key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


def file_pages_by_tensor(pid: int, model: Path, tensors: list[tuple[int, int, str]]) -> collections.Counter:
    starts = [t[0] for t in tensors]
    import bisect
    pages: collections.Counter = collections.Counter()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or Path(parts[5]).resolve() != model.resolve():
                continue
            begin, end = (int(x, 16) for x in parts[0].split("-"))
            offset = int(parts[2], 16)
            pagemap.seek(begin // PAGE * 8)
            entries = pagemap.read((end - begin) // PAGE * 8)
            for i in range((end - begin) // PAGE):
                if not struct.unpack_from("<Q", entries, i * 8)[0] >> 63:
                    continue
                at = offset + i * PAGE
                k = bisect.bisect_right(starts, at) - 1
                name = tensors[k][2] if k >= 0 and at < tensors[k][1] else "metadata (header, vocabulary)"
                pages[name] += 1
    return pages


def mappings(pid: int) -> list[tuple[int, str]]:
    out, current = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split()
            current = [0, parts[5] if len(parts) > 5 else "[anonymous]"]
            out.append(current)
        elif line.startswith("Rss:") and current is not None:
            current[0] = int(line.split()[1])
    return sorted(((kib, name) for kib, name in out), reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layout", choices=["one", "tensor", "pipeline"])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "inferd")
    ap.add_argument("--kv-blocks", type=int, default=KV_BLOCKS)
    args = ap.parse_args()
    sizes = [] if args.layout == "one" else [f"--{args.layout}-parallel-size", "2"]
    cmd = ([] if args.layout == "one" else MPIRUN) + [
        str(args.binary), "bench", "latency", "-m", str(args.model), "--threads", "2" if args.layout == "one" else "1",
        *sizes, "--input-len", "32", "--output-len", "400", "--num-iters", "3", "--num-iters-warmup", "0",
        "--num-gpu-blocks-override", str(args.kv_blocks)]
    tensors = tensor_ranges(args.model)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=MPI_ENV)
    try:
        last: dict[int, int] = {}
        steady = 0
        while proc.poll() is None:
            time.sleep(2)
            now = {}
            for pid in inferd_pids(proc.pid):
                try:
                    now[pid] = status(pid, "VmRSS")
                except (OSError, AttributeError):
                    pass
            steady = steady + 1 if now and now == last else 0
            last = now
            if steady < 3:
                continue
            for rank, pid in enumerate(sorted(now)):
                print(f"rank {rank} (pid {pid}): peak {status(pid, 'VmHWM') / 1024:.0f} MiB; resident "
                      f"{now[pid] / 1024:.0f} MiB = anonymous {status(pid, 'RssAnon') / 1024:.0f} + file "
                      f"{status(pid, 'RssFile') / 1024:.0f} + shared {status(pid, 'RssShmem') / 1024:.0f}")
                for kib, name in mappings(pid)[:6]:
                    print(f"    {kib / 1024:7.1f} MiB  {name}")
                print("  the model file's resident pages, by tensor:")
                for name, n in file_pages_by_tensor(pid, args.model, tensors).most_common(8):
                    print(f"    {n * PAGE / 2**20:7.1f} MiB  {name}")
            return 0
        print("the run ended before its resident sets settled", file=sys.stderr)
        return 1
    finally:
        proc.kill()
        subprocess.run(["pkill", "-f", f"{args.binary} bench latency"], check=False)


if __name__ == "__main__":
    sys.exit(main())
