"""Streaming a multi-GB training log in bounded memory (the diagnose issue's acceptance).

Writes a synthetic log (default 2 GiB) of interleaved ranks: iteration lines, Bridge memory
reports, NCCL chatter, random garbage, cut lines and a few lines far over MAX_LINE_BYTES, then
parses it in a child process and reports the child's peak resident memory (ru_maxrss) and the
throughput. The bound holds when the peak does not grow with the file size: run with two sizes.

    python benchmarks/log_streaming.py [--gib 2] [--keep PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import log_fixtures as lf

from benchmarks.published import write_json

_CHILD = """
import json, resource, sys, time
from lcmoe.diagnose.logs import read_log
from lcmoe.diagnose.steps import step_stats
start = time.perf_counter()
summary = read_log(sys.argv[1])
elapsed = time.perf_counter() - start
stats = step_stats(summary)
print(json.dumps({
    "seconds": elapsed,
    "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "lines": summary.lines,
    "bytes": summary.bytes_read,
    "iterations_kept": len(summary.iterations),
    "iteration_lines": summary.iteration_lines,
    "garbage_lines": summary.garbage_lines,
    "overlong_lines": summary.overlong_lines,
    "median_step_seconds": stats.median_seconds if stats else None,
}))
"""


def synthetic_block(seed: int, iterations: int = 2000) -> bytes:
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(1, iterations + 1):
        rank = rng.randrange(64)
        lines.append(f"[rank{rank}]: " + lf.iteration_line(i, 10**6, 2000.0 * (1 + rng.uniform(-0.02, 0.02))))
        lines.append(
            f"[rank{rank}]: node{rank // 8}:123:456 [{rank % 8}] NCCL INFO Channel 00/0 : {rank} -> {rank + 1}"
        )
        if i % 50 == 0:
            lines.append(lf.bridge_memory_line(rank, i, 60 + rng.random(), 70.0))
        roll = rng.random()
        if roll < 0.05:
            line = lines[-2]
            lines.append(line[: rng.randrange(len(line))])
        elif roll < 0.08:
            lines.append("".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(rng.randrange(300))))
    if seed % 7 == 0:
        lines.append("z" * 300_000)  # a line far over MAX_LINE_BYTES
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_log(path: Path, size_bytes: int) -> int:
    blocks = [synthetic_block(seed) for seed in range(8)]
    written = 0
    with path.open("wb") as handle:
        while written < size_bytes:
            block = blocks[(written // len(blocks[0])) % len(blocks)]
            handle.write(block)
            written += len(block)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, nargs="+", default=[0.25, 2.0])
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    results = []
    print(f"{'file GiB':>8s} {'lines':>11s} {'MB/s':>7s} {'peak RSS MiB':>12s} {'kept':>7s} {'garbage':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for gib in args.gib:
            path = Path(tmp) / f"train_{gib}.log"
            t0 = time.perf_counter()
            size = write_log(path, int(gib * 1024**3))
            written_s = time.perf_counter() - t0
            done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True)
            row = json.loads(done.stdout)
            row.update(file_bytes=size, write_seconds=written_s, mb_per_second=size / 1e6 / row["seconds"])
            results.append(row)
            path.unlink()
            print(
                f"{size / 1024**3:8.2f} {row['lines']:11d} {row['mb_per_second']:7.1f} "
                f"{row['peak_rss_kib'] / 1024:12.1f} {row['iterations_kept']:7d} {row['garbage_lines']:8d}"
            )
    if args.json_out:
        write_json(args.json_out, {"runs": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
