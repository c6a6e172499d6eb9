"""Every input surface fuzzed (the robustness issue's acceptance): ≥ 10,000 generated cases per
surface — HF config.json, lcmoe model YAML, hardware YAML, CLI numbers, layouts (with the
estimator invariants and monotonicities), `check` inputs (Megatron-LM args, Bridge overrides and
YAML), plan JSON, training logs — and the hostile-input surfaces of issue #31: hostile YAML/JSON
text (deep nesting, alias bombs, 5000-digit integers, non-finite values, binary, megabyte
scalars) through every reader, special files (/dev/zero, FIFOs, directories, sparse 17 MiB
files, symlink loops), pipeline layouts with huge repeats through the CLI, overrides, Megatron
arguments and plan.json, calibrations with non-finite and out-of-range coefficients, and the CLI
writing to a closed, full, broken or ASCII-only stdout — plus one 10⁶-line log. Each case must
end in a result or one LcmoeError sentence within 10 s, and the process must stay within 1 GB of
resident memory; anything else is a failure. Prints the counts, the slowest case and the peak
RSS per surface; exit 1 on any failure.

    python benchmarks/fuzz.py [--cases 10000] [--surface NAME …] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import log_fixtures as lf
from tests.fuzz_surfaces import SURFACES, run_surface

from benchmarks.published import write_json


def million_line_log() -> dict[str, object]:
    """10⁶ interleaved, partly mangled lines through the parser in one go."""
    from lcmoe.diagnose.logs import parse_log_lines
    from lcmoe.diagnose.steps import step_stats

    def lines():  # type: ignore[no-untyped-def]
        block = lf.with_rank_prefix(lf.steady_iterations(1000, 1500.0), 3) + ["garbage \x00\ufffd line"] * 10
        for i in range(1_000_000 // len(block)):
            yield from (line[: len(line) // 2] if j % 97 == i % 97 else line for j, line in enumerate(block))

    start = time.perf_counter()
    summary = parse_log_lines(lines())
    stats = step_stats(summary)
    return {
        "lines": summary.lines,
        "seconds": time.perf_counter() - start,
        "iterations_kept": len(summary.iterations),
        "median_step_seconds": stats.median_seconds if stats else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--surface", nargs="*", default=list(SURFACES), choices=list(SURFACES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    rows = []
    header = f"{'surface':16s} {'cases':>7s} {'results':>8s} {'errors':>7s} {'failures':>8s} {'seconds':>8s}"
    print(f"{header} {'slowest':>8s} {'peak MiB':>8s}  outcomes")
    for name in args.surface:
        start = time.perf_counter()
        report = run_surface(name, args.cases, args.seed)
        seconds = time.perf_counter() - start
        outcomes = ", ".join(f"{k}: {v}" for k, v in report.outcomes.most_common())
        print(
            f"{name:16s} {report.cases:7d} {report.results:8d} {report.errors:7d} {len(report.failures):8d} "
            f"{seconds:8.1f} {report.slowest_seconds:8.2f} {report.peak_rss_bytes / 1024**2:8.0f}  {outcomes}"
        )
        for failure in report.failures[:5]:
            print(f"    {failure[:400]}")
        rows.append(
            {
                "surface": name,
                "cases": report.cases,
                "results": report.results,
                "errors": report.errors,
                "failures": len(report.failures),
                "failure_examples": report.failures[:20],
                "outcomes": dict(report.outcomes),
                "seconds": seconds,
                "slowest_case_seconds": report.slowest_seconds,
                "peak_rss_bytes": report.peak_rss_bytes,
            }
        )
    big = million_line_log()
    print(f"10^6-line log: {big['lines']} lines in {big['seconds']:.1f} s, median step {big['median_step_seconds']}")
    total = sum(r["failures"] for r in rows)  # type: ignore[misc]
    print(f"total failures: {total}")
    if args.json_out:
        write_json(args.json_out, {"cases_per_surface": args.cases, "seed": args.seed, "surfaces": rows, "log": big})
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
