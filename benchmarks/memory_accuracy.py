"""Memory estimator accuracy on measured runs, with the coefficients shipped in the package.

For every row of a CSV with megatron_golden.csv's columns (Megatron-LM CI runs with exact
arguments and measured ``mem-max-allocated-bytes`` on the last rank), build the configuration
from the row's arguments, predict that rank's peak allocated memory and print the error.
Never refits. ``--points`` checks memory_points.csv: every documented fit must be predicted to
fit, every documented OOM to OOM.

    python benchmarks/memory_accuracy.py [--data PATH] [--points PATH] [--json OUT] [--quiet]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.golden import GoldenCase, build_case, predict_last_rank
from benchmarks.points import evaluate_points
from benchmarks.published import REFERENCE, read_rows, write_json
from lcmoe.estimate.memory import shipped_coefficients


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    low, high = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def golden_errors(path: str) -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    coefficients = shipped_coefficients()
    rows, skipped = [], []
    for row in read_rows(path):
        case = build_case(row)
        if not isinstance(case, GoldenCase):
            skipped.append({"row": row.get("test_case", "?"), "reason": case})
            continue
        predicted = predict_last_rank(case, coefficients)
        rows.append(
            {
                "row": case.name,
                "environment": row.get("environment", ""),
                "measured_gib": case.measured / 2**30,
                "predicted_gib": predicted / 2**30,
                "err_pct": 100 * (predicted / case.measured - 1),
            }
        )
    return rows, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REFERENCE / "megatron_golden.csv"))
    parser.add_argument("--points", default=str(REFERENCE / "memory_points.csv"))
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--quiet", action="store_true", help="summary only")
    args = parser.parse_args(argv)

    rows, skipped = golden_errors(args.data)
    errors = [abs(float(r["err_pct"])) for r in rows]  # type: ignore[arg-type]
    if not args.quiet:
        print(f"{'row':100s} {'meas GiB':>9s} {'pred GiB':>9s} {'err%':>7s}")
        for r in sorted(rows, key=lambda r: float(r["err_pct"])):  # type: ignore[arg-type]
            print(f"{r['row']!s:100s} {r['measured_gib']:9.3f} {r['predicted_gib']:9.3f} {r['err_pct']:+7.1f}")
        for s in skipped:
            print(f"cannot model: {s['row']}: {s['reason']}")
    median = statistics.median(errors) if errors else 0.0
    p90 = percentile(errors, 0.9)
    print(
        f"\ngolden rows: n={len(rows)} median |err| {median:.2f}%  p90 |err| {p90:.2f}%  (cannot model {len(skipped)})"
    )
    by_environment: dict[str, dict[str, float]] = {}
    for env in sorted({str(r["environment"]) for r in rows}):
        subset = [abs(float(r["err_pct"])) for r in rows if r["environment"] == env]  # type: ignore[arg-type]
        by_environment[env] = {
            "n": len(subset),
            "median_abs_pct_err": statistics.median(subset),
            "p90_abs_pct_err": percentile(subset, 0.9),
        }
        print(
            f"  container '{env}': n={len(subset)} median {statistics.median(subset):.2f}%  "
            f"p90 {percentile(subset, 0.9):.2f}%"
        )

    points = evaluate_points(args.points, verbose=not args.quiet) if Path(args.points).exists() else None
    agreement = points["fit_agreement"] if points else None
    if points:
        print(
            f"memory_points: {points['n_modelled']} modelled, agreement {100 * points['fit_agreement']:.0f}% "
            f"({points['n_cannot_model']} rows cannot be modelled); predicted more than 5% from capacity: "
            f"{points['n_decisive']} rows, agreement {100 * points['fit_agreement_decisive']:.0f}%"
        )
        print(
            f"  with the at-risk verdict (a fit inside the estimator's error band): documented OOMs "
            f"predicted OOM or at risk {points['n_oom_predicted_oom_or_at_risk']}/{points['n_oom_documented']}; "
            f"documented fits flagged at risk {points['n_fits_predicted_at_risk']}/{points['n_fits_documented']}"
        )
        if points["measured_peaks_n"]:
            median_err, max_err = points["measured_peaks_median_abs_pct_err"], points["measured_peaks_max_abs_pct_err"]
            print(
                f"  measured peaks (lower bounds left out): n={points['measured_peaks_n']} "
                f"median |err| {median_err:.1f}%  max {max_err:.1f}%"
            )
    if args.json_out:
        write_json(
            args.json_out,
            {
                "n": len(rows),
                "median_abs_pct_err": median,
                "p90_abs_pct_err": p90,
                "fit_agreement": agreement,
                "by_environment": by_environment,
                "rows": rows,
                "skipped": skipped,
                "points": points,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
