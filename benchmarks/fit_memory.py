"""Fit the memory estimator's few free coefficients on megatron_golden.csv and ship them.

The physics (every stored tensor, model state, logits) is fixed; what cannot be derived is fitted:
a constant workspace (cuBLAS/TE workspaces, RNG states), a model-state bookkeeping fraction
(DDP bucket padding), and multipliers on stored activations (all blocks, and MoE blocks on top)
and on the logits buffers. All are bounded to physical ranges.
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
import yaml
from scipy.optimize import least_squares

from benchmarks.golden import GoldenCase, build_case, predict_last_rank
from benchmarks.published import REFERENCE, REPO, read_rows
from lcmoe.estimate.memory import MemoryCoefficients

GIB = 1024.0**3
# name, lower, upper, scale (the optimiser works on value / scale)
PARAMETERS = (
    ("workspace_bytes", 0.0, 4 * GIB, GIB),
    ("state_overhead_fraction", 0.0, 0.3, 1.0),
    ("activation_scale", 0.5, 2.0, 1.0),
    ("moe_activation_scale", 0.5, 3.0, 1.0),
    ("logits_scale", 0.5, 2.0, 1.0),
)
OUTPUT = REPO / "src" / "lcmoe" / "data" / "memory_coefficients.yaml"


def coefficients_from(vector: np.ndarray) -> MemoryCoefficients:
    values = {name: float(v * scale) for (name, _, _, scale), v in zip(PARAMETERS, vector, strict=True)}
    return dataclasses.replace(MemoryCoefficients(), **values)


def relative_errors(cases: list[GoldenCase], coefficients: MemoryCoefficients) -> np.ndarray:
    return np.array([predict_last_rank(c, coefficients) / c.measured - 1.0 for c in cases])


def fit(cases: list[GoldenCase]) -> MemoryCoefficients:
    lower = np.array([lo / scale for _, lo, _, scale in PARAMETERS])
    upper = np.array([hi / scale for _, _, hi, scale in PARAMETERS])
    start = np.clip(np.array([0.2, 0.05, 1.0, 1.0, 1.0]), lower, upper)
    result = least_squares(
        lambda v: relative_errors(cases, coefficients_from(v)),
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


def cross_validate(cases: list[GoldenCase], folds: int = 5) -> np.ndarray:
    errors = np.zeros(len(cases))
    for k in range(folds):
        train = [c for c in cases if fold_of(c, folds) != k]
        held = [i for i, c in enumerate(cases) if fold_of(c, folds) == k]
        coefficients = fit(train)
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
    coefficients = fit(cases)
    in_sample = summary(relative_errors(cases, coefficients))
    held_out = summary(cross_validate(cases))
    for name, *_ in PARAMETERS:
        print(f"{name:26s} {getattr(coefficients, name):.6g}")
    print(f"in-sample : {in_sample}")
    print(f"5-fold CV : {held_out}  (test cases grouped; rows the fit did not see)")
    if args.write:
        payload = {
            "coefficients": {name: getattr(coefficients, name) for name, *_ in PARAMETERS},
            "fit": {
                "date": dt.date.today().isoformat(),
                "script": "benchmarks/fit_memory.py",
                "data": Path(args.data).name,
                "rows": in_sample["n"],
                "in_sample": in_sample,
                "grouped_5fold_cv": held_out,
                "target": "mem_max_allocated_bytes_first (last rank)",
            },
        }
        OUTPUT.write_text(
            "# Written by benchmarks/fit_memory.py --write; do not edit by hand.\n"
            + yaml.safe_dump(payload, sort_keys=False),
            encoding="utf-8",
        )
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
