"""Fit the memory estimator's few free coefficients on megatron_golden.csv and ship them.

Also uses every published Bridge run (perf_summary ⋈ perf_recipes, long_context) as a one-sided
constraint: it ran, so its reserved memory must be predicted within the GPU (hinge penalty).

The physics (every stored tensor, model state, logits) is fixed; what cannot be derived is fitted:
a constant workspace (cuBLAS/TE workspaces, RNG states), a model-state bookkeeping fraction
(DDP bucket padding), and multipliers on stored activations (all blocks; MoE blocks under the
allgather dispatcher on top) and on the logits buffers. All are bounded to physical ranges.
The fragmentation fraction (reserved over allocated) is the median of the memory_points.csv rows
that publish both numbers for one run; it is computed, not fitted.
The one-layer backward working set and the MoE dispatch buffers are not fitted: the measured
rank is the loss stage, whose peak is at the loss, so the data cannot see them; they keep their
physical values (one layer; the send and receive buffers).

Robust least squares (soft-L1 on relative error) so that rows whose container differs from the
rest (the "lts" goldens) cannot drag the fit; then grouped 5-fold cross-validation, where all
goldens of one test case (its platforms and resumed runs) fall in the same fold, reports the
error on rows the fit did not see.

    pip install '.[bench]'
    python benchmarks/fit_memory.py [--data PATH] [--write]   # --write updates the shipped YAML
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from scipy.optimize import least_squares

from benchmarks.golden import GoldenCase, build_case, predict_last_rank
from benchmarks.published import REFERENCE, REPO, read_rows, write_coefficients
from lcmoe.estimate.memory import MemoryCoefficients

GIB = 1024.0**3
# name, lower, upper, scale (the optimiser works on value / scale)
PARAMETERS = (
    ("workspace_bytes", 0.0, 4 * GIB, GIB),
    ("state_overhead_fraction", 0.0, 0.3, 1.0),
    ("activation_scale", 0.5, 2.0, 1.0),
    ("allgather_moe_scale", 0.5, 3.0, 1.0),
    ("logits_scale", 0.5, 2.0, 1.0),
)
OUTPUT = REPO / "src" / "lcmoe" / "data" / "memory_coefficients.yaml"


def coefficients_from(vector: np.ndarray) -> MemoryCoefficients:
    values = {name: float(v * scale) for (name, _, _, scale), v in zip(PARAMETERS, vector, strict=True)}
    return dataclasses.replace(MemoryCoefficients(), fragmentation_fraction=FRAGMENTATION, **values)


def relative_errors(cases: list[GoldenCase], coefficients: MemoryCoefficients) -> np.ndarray:
    return np.array([predict_last_rank(c, coefficients) / c.measured - 1.0 for c in cases])


def published_runs() -> list[object]:
    """Published Bridge runs (perf_summary ⋈ perf_recipes, long_context): each one ran, so each
    must be predicted to fit its GPU. They enter the fit as one-sided (hinge) terms only."""
    from benchmarks.perf_rows import long_context_cases, perf_cases

    cases, _ = perf_cases(
        str(REFERENCE / "perf_summary.csv"), str(REFERENCE / "perf_recipes.csv"), tasks=PUBLISHED_TASKS
    )
    long_context, _ = long_context_cases(str(REFERENCE / "long_context.csv"))
    return [c.run for c in cases + long_context]


HINGE_WEIGHT = 0.25
# Every published task: pretraining, full finetuning (sft) and LoRA.
PUBLISHED_TASKS = ("pretrain", "sft", "lora")


def fragmentation_from_points(path: Path) -> float:
    """Median of peak_reserved / peak_allocated − 1 over memory_points.csv rows that publish both
    for the same run (runs with expandable segments); allocator fragmentation above allocated."""
    pairs: dict[str, dict[str, float]] = {}
    for row in read_rows(path):
        if row.get("metric") in ("peak_allocated", "peak_reserved") and row.get("peak_mem_gb"):
            pairs.setdefault(row.get("config_detail", ""), {})[row["metric"]] = float(row["peak_mem_gb"])
    ratios = sorted(v["peak_reserved"] / v["peak_allocated"] - 1 for v in pairs.values() if len(v) == 2)
    return float(np.median(ratios)) if ratios else MemoryCoefficients().fragmentation_fraction


FRAGMENTATION = fragmentation_from_points(REFERENCE / "memory_points.csv")


def overshoot(runs: list[object], coefficients: MemoryCoefficients) -> np.ndarray:
    """max(0, reserved / capacity − 1) for runs that are known to fit."""
    from lcmoe.estimate.memory import estimate_memory

    out = []
    for run in runs:
        est = estimate_memory(run.model, run.hardware, run.layout, run.options, coefficients)  # type: ignore[attr-defined]
        out.append(max(0.0, est.peak_reserved_bytes / est.capacity_bytes - 1.0))
    return HINGE_WEIGHT * np.array(out)


def fit(cases: list[GoldenCase], runs: list[object] | None = None) -> MemoryCoefficients:
    lower = np.array([lo / scale for _, lo, _, scale in PARAMETERS])
    upper = np.array([hi / scale for _, _, hi, scale in PARAMETERS])
    start = np.clip(np.array([0.2, 0.05, 1.0, 1.0, 1.0]), lower, upper)
    constraints = runs or []
    result = least_squares(
        lambda v: np.concatenate(
            [relative_errors(cases, coefficients_from(v)), overshoot(constraints, coefficients_from(v))]
        ),
        start,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=0.05,
    )
    return coefficients_from(result.x)


def summary(errors: np.ndarray) -> dict[str, float]:
    absolute = np.abs(errors) * 100
    return {
        "n": len(errors),
        "median_abs_pct_err": float(np.median(absolute)),
        "p90_abs_pct_err": float(np.percentile(absolute, 90)),
        "median_signed_pct_err": float(np.median(errors) * 100),
    }


def fold_of(case: GoldenCase, folds: int) -> int:
    return zlib.crc32(case.row["test_case"].encode()) % folds


def cross_validate(cases: list[GoldenCase], runs: list[object], folds: int = 5) -> np.ndarray:
    errors = np.zeros(len(cases))
    for k in range(folds):
        train = [c for c in cases if fold_of(c, folds) != k]
        held = [i for i, c in enumerate(cases) if fold_of(c, folds) == k]
        coefficients = fit(train, runs)
        for i in held:
            errors[i] = predict_last_rank(cases[i], coefficients) / cases[i].measured - 1.0
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REFERENCE / "megatron_golden.csv"))
    parser.add_argument("--write", action="store_true", help="write the shipped coefficient file")
    args = parser.parse_args(argv)

    built = [build_case(row) for row in read_rows(args.data)]
    cases = [c for c in built if isinstance(c, GoldenCase)]
    runs = published_runs()
    coefficients = fit(cases, runs)
    in_sample = summary(relative_errors(cases, coefficients))
    held_out = summary(cross_validate(cases, runs))
    still_over = int(np.count_nonzero(overshoot(runs, coefficients)))
    print(f"published runs predicted not to fit: {still_over} of {len(runs)}")
    for name, *_ in PARAMETERS:
        print(f"{name:26s} {getattr(coefficients, name):.6g}")
    print(f"in-sample : {in_sample}")
    print(f"5-fold CV : {held_out}  (test cases grouped; rows the fit did not see)")
    if args.write:
        payload = {
            "coefficients": {
                **{name: getattr(coefficients, name) for name, *_ in PARAMETERS},
                "fragmentation_fraction": FRAGMENTATION,
            },
            "fit": {
                "date": dt.date.today().isoformat(),
                "script": "benchmarks/fit_memory.py",
                "data": Path(args.data).name,
                "rows": in_sample["n"],
                "in_sample": in_sample,
                "grouped_5fold_cv": held_out,
                "published_runs_constraint": {
                    "n": len(runs),
                    "predicted_not_to_fit": still_over,
                    "hinge_weight": HINGE_WEIGHT,
                },
                "target": "mem_max_allocated_bytes_first (last rank)",
            },
        }
        write_coefficients(OUTPUT, payload, script="benchmarks/fit_memory.py")
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
