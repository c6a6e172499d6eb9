"""How much `lcmoe calibrate` gains from a user's own runs.

For every (model, GPU) group of the shared perf data (perf_summary.csv ⋈ perf_recipes.csv, plus
long_context.csv) with at least two rows, one row plays the user's "own run": the first row of
the group in file order (a fixed rule, not chosen by error). Its published TFLOP/s becomes a
measured step time (model FLOPs per step / (TFLOP/s · GPUs), the inverse of Bridge's own
formula), ``calibrate`` fits on it alone, and every other row of the group is predicted with the
shipped coefficients (before) and the calibrated ones (after). ``--anchors 2`` uses the first two
rows (then the compute and communication scales are fitted separately).

``--prior`` prints the two spreads calibration.py uses as its prior (log units): how far a
group's mean error strays from zero (σ_cluster, after removing the within-group share) and how
far one row strays from its group's mean (σ_run).

    python benchmarks/calibration_gain.py [--anchors N] [--prior] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.perf_rows import PerfCase, container_factor, long_context_cases, perf_cases, split_time_holdout
from benchmarks.published import REFERENCE, write_json
from lcmoe.estimate.calibration import MeasuredRun, calibrate
from lcmoe.estimate.time import TimeCoefficients, combine, shipped_time_coefficients, time_amounts


def software_factor(case: PerfCase) -> float:
    """The case's container throughput relative to the reference container (fit_time.py)."""
    return container_factor(shipped_time_coefficients(case.run.hardware.architecture), case.container)


def measured_step(case: PerfCase) -> float:
    """The published run's step time, brought to the reference container (what lcmoe predicts)."""
    amounts = time_amounts(case.run)
    return amounts.model_flops_per_step / (case.published_tflops * 1e12 * case.run.num_gpus) * software_factor(case)


def predicted_tflops(case: PerfCase, coefficients: TimeCoefficients | None = None) -> float:
    """TFLOP/s for the case's own container, with the shipped (or given) coefficients."""
    c = coefficients or shipped_time_coefficients(case.run.hardware.architecture)
    return combine(time_amounts(case.run), c).model_tflops_per_gpu * software_factor(case)


def prior_spreads(groups: dict[tuple[str, str], list[PerfCase]]) -> tuple[float, float]:
    """(σ_cluster, σ_run) of log(predicted / published) over groups of ≥ 2 rows (one-way ANOVA)."""
    means, within, sizes = [], [], []
    for members in groups.values():
        if len(members) < 2:
            continue
        errors = [math.log(predicted_tflops(c) / c.published_tflops) for c in members]
        mean = statistics.mean(errors)
        means.append(mean)
        sizes.append(len(errors))
        within += [(e - mean) ** 2 * len(errors) / (len(errors) - 1) for e in errors]
    run_var = statistics.mean(within)
    cluster_var = statistics.mean(m * m for m in means) - run_var / statistics.mean(sizes)
    return math.sqrt(max(cluster_var, 0.0)), math.sqrt(run_var)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REFERENCE / "perf_summary.csv"))
    parser.add_argument("--recipes", default=str(REFERENCE / "perf_recipes.csv"))
    parser.add_argument("--long-context", default=str(REFERENCE / "long_context.csv"))
    parser.add_argument("--anchors", type=int, default=1)
    parser.add_argument("--prior", action="store_true", help="print the calibration prior's spreads")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)

    cases = split_time_holdout(perf_cases(args.data, args.recipes)[0])[0]
    if Path(args.long_context).exists():
        cases += long_context_cases(args.long_context)[0]
    groups: dict[tuple[str, str], list[PerfCase]] = {}
    for case in cases:
        groups.setdefault((case.model_name, case.run.hardware.name), []).append(case)

    if args.prior:
        cluster, run = prior_spreads(groups)
        print(f"sigma_cluster {cluster:.3f}  sigma_run {run:.3f}  (log units; calibration.py CLUSTER_SIGMA, RUN_SIGMA)")
        return 0
    rows = []
    print(f"{'model':22s} {'gpu':6s} {'n':>3s} {'scales':>22s} {'MAPE before':>11s} {'after':>7s}")
    for (model, gpu), members in sorted(groups.items()):
        if len(members) <= args.anchors:
            continue
        anchors, others = members[: args.anchors], members[args.anchors :]
        calibration = calibrate([MeasuredRun(a.run, measured_step(a), a.name) for a in anchors])
        before, after = [], []
        for case in others:
            before.append(abs(predicted_tflops(case) / case.published_tflops - 1) * 100)
            after.append(abs(predicted_tflops(case, calibration.coefficients) / case.published_tflops - 1) * 100)
        scales = ", ".join(f"{k[:4]} {v:.2f}" for k, v in calibration.scales.items())
        print(
            f"{model[:22]:22s} {gpu:6s} {len(others):3d} {scales:>22s} "
            f"{statistics.mean(before):11.1f} {statistics.mean(after):7.1f}"
        )
        rows.append(
            {
                "model": model,
                "gpu": gpu,
                "anchors": [a.name for a in anchors],
                "evaluated": len(others),
                "scales": calibration.scales,
                "errors_before_pct": before,
                "errors_after_pct": after,
            }
        )
    # The bound on any per-group scale: divide each held-out row by its group's median error.
    oracle = []
    for members in groups.values():
        if len(members) <= args.anchors:
            continue
        ratios = [predicted_tflops(c) / c.published_tflops for c in members]
        middle = statistics.median(ratios)
        oracle += [abs(r / middle - 1) * 100 for r in ratios[args.anchors :]]
    all_before = [e for r in rows for e in r["errors_before_pct"]]
    all_after = [e for r in rows for e in r["errors_after_pct"]]
    summary = {
        "anchors_per_group": args.anchors,
        "groups": len(rows),
        "rows_evaluated": len(all_before),
        "mape_before": statistics.mean(all_before),
        "mape_after": statistics.mean(all_after),
        "median_before": statistics.median(all_before),
        "median_after": statistics.median(all_after),
        "mape_best_group_scale": statistics.mean(oracle),
    }
    print(
        f"\n{summary['rows_evaluated']} held-out rows in {summary['groups']} groups: "
        f"MAPE {summary['mape_before']:.2f}% → "
        f"{summary['mape_after']:.2f}% (median {summary['median_before']:.2f}% → {summary['median_after']:.2f}%); "
        f"the best any per-group scale could do: {summary['mape_best_group_scale']:.2f}%"
    )
    if args.json_out:
        write_json(args.json_out, {"summary": summary, "groups": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
