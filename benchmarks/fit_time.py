"""Fit the step-time model's efficiencies per hardware family and ship them.

Data: perf_summary.csv ⋈ perf_recipes.csv (the recipe settings behind each published row) for
catalog models, plus long_context.csv (the DSV3 H100 CP-scaling series and Qwen3-235B GB200).
Target: published model TFLOP/s/GPU. Residual: log(predicted / published), soft-L1 (robust to
a few mislabelled rows). Each family (hopper, blackwell) gets its own dense-GEMM efficiency per
precision class, grouped-GEMM and attention efficiencies, per-layer host/launch overhead and an
EP-communication efficiency; the CP-ring hidden share is fitted on the long-context rows (the
only CP > 1 data). Every efficiency is bounded by a measured kernel ceiling (see BOUNDS), and the
attention efficiency by the family's measured kernel range (family_bounds).

    pip install '.[bench]'
    python benchmarks/fit_time.py [--write] [--lomo]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from scipy.optimize import least_squares

from benchmarks.perf_rows import (
    LONG_CONTEXT,
    PerfCase,
    container_factor,
    long_context_cases,
    perf_cases,
    reference_container,
    version_key,
)
from benchmarks.published import REFERENCE, REPO, write_coefficients
from lcmoe.estimate.time import (
    ATTENTION_EFFICIENCY_MEASURED,
    COEFFICIENT_BOUNDS,
    RunAmounts,
    TimeCoefficients,
    combine,
    time_amounts,
)

OUTPUT = REPO / "src" / "lcmoe" / "data" / "time_coefficients.yaml"
# The fitted subset of the shared bounds (measured ceilings; see time.py COEFFICIENT_BOUNDS).
BOUNDS = {k: v for k, v in COEFFICIENT_BOUNDS.items() if k not in ("nvlink_efficiency", "scaleout_efficiency")}


def parameters_for(cases: list[PerfCase]) -> list[str]:
    """Only the parameters some row of the family exercises."""
    names = ["gemm_efficiency_bf16", "attention_efficiency", "layer_overhead_seconds"]
    precisions = {c.run.options.tensor_core_precision for c in cases}
    if precisions & {"fp8", "mxfp8"}:
        names.append("gemm_efficiency_fp8")
    if "nvfp4" in precisions:
        names.append("gemm_efficiency_fp4")
    if any(c.run.model.is_moe for c in cases):
        names += [
            "grouped_gemm_efficiency",
            "ep_comm_efficiency",
            "moe_layer_overhead_seconds",
            "moe_permute_passes",
            "grouped_gemm_half_size",
        ]
        if any(c.run.layout.ep * c.run.layout.etp > c.run.hardware.nvlink_domain_size for c in cases):
            names.append("ep_network_efficiency")
    if any(c.run.layout.cp > 1 for c in cases) and _moves_residuals(cases, "cp_ring_hidden"):
        names.append("cp_ring_hidden")
    return names


def _moves_residuals(cases: list[PerfCase], name: str) -> bool:
    """Whether any row's prediction depends on coefficient ``name`` across its bounds. Where none
    does (Blackwell's CP rows: every ring step's attention outlasts its NVLink exchange), the
    coefficient is not fitted and keeps its prior instead of drifting to an arbitrary bound."""
    low, high = BOUNDS[name]
    at = [residuals(cases, dataclasses.replace(TimeCoefficients(), **{name: v})) for v in (low, high)]
    return bool(np.any(np.abs(at[0] - at[1]) > 1e-9))


_AMOUNTS: dict[int, RunAmounts] = {}


def amounts(case: PerfCase) -> RunAmounts:
    """Coefficient-free amounts, computed once per case (the fit only changes rates)."""
    key = id(case)
    if key not in _AMOUNTS:
        _AMOUNTS[key] = time_amounts(case.run)
    return _AMOUNTS[key]


def predicted_tflops(case: PerfCase, coefficients: TimeCoefficients) -> float:
    """The model's TFLOP/s for the case's own container (reference-container prediction × the
    container's fitted software factor)."""
    return combine(amounts(case), coefficients).model_tflops_per_gpu * container_factor(coefficients, case.container)


def residuals(cases: list[PerfCase], coefficients: TimeCoefficients) -> np.ndarray:
    return np.array([np.log(predicted_tflops(c, coefficients) / c.published_tflops) for c in cases])


CONTAINER_FACTOR_BOUNDS = (0.5, 2.0)
# The GPU each family's datasheet-peak rates are taken at; the others get a fitted clock factor.
REFERENCE_GPUS = ("h100", "b200")
GPU_PREFIX = "gpu:"
# Prior on each container's factor: log-normal around 1 with this width. A container with a
# handful of rows then cannot move its factor far on their noise (hopper's newest has 2 rows).
CONTAINER_PRIOR_SIGMA = 0.1
ROW_SCALE = 0.1  # soft-L1 scale of the row residuals (log units)


def family_bounds(architecture: str) -> dict[str, tuple[float, float]]:
    """BOUNDS, with attention held to the family's measured kernel range (time.py
    ATTENTION_EFFICIENCY_MEASURED; ampere uses hopper's)."""
    measured = ATTENTION_EFFICIENCY_MEASURED.get(architecture, ATTENTION_EFFICIENCY_MEASURED["hopper"])
    return BOUNDS | {"attention_efficiency": measured}


def fit_family(cases: list[PerfCase], base: TimeCoefficients | None = None) -> TimeCoefficients:
    """Efficiencies of one hardware family, plus one throughput factor per container relative to
    the newest (the software-release effect the guidance's LC-CONTAINER rule warns about); the
    shipped efficiencies therefore predict the newest container."""
    start_coeffs = base or TimeCoefficients()
    names = parameters_for(cases)
    reference = reference_container(cases)
    # The long-context card's runs are taken as the newest software (no factor of their own), so
    # their misfit stays visible and shapes the long-context terms instead of being scaled away.
    containers = sorted({c.container for c in cases} - {reference, LONG_CONTEXT}, key=version_key)
    # One sustained-clock factor per GPU but the family's reference GPU (same prior as the
    # container factors: log-normal around 1).
    gpus = sorted({c.run.hardware.name for c in cases} - set(REFERENCE_GPUS))
    extras = containers + [GPU_PREFIX + g for g in gpus]
    low_f, high_f = (float(np.log(b)) for b in CONTAINER_FACTOR_BOUNDS)
    bounds = family_bounds(cases[0].run.hardware.architecture)
    lower = np.array([bounds[n][0] for n in names] + [low_f] * len(extras))
    upper = np.array([bounds[n][1] for n in names] + [high_f] * len(extras))
    units = {"moe_permute_passes": 10.0, "grouped_gemm_half_size": 1e7}
    scale = np.array(
        [1e-3 if n.endswith("overhead_seconds") else units.get(n, 1.0) for n in names] + [1.0] * len(extras)
    )
    start = np.clip(np.array([getattr(start_coeffs, n) for n in names] + [0.0] * len(extras)), lower, upper) / scale

    def build(vector: np.ndarray) -> TimeCoefficients:
        values = vector * scale
        fitted = {k: float(np.exp(v)) for k, v in zip(extras, values[len(names) :], strict=True)}
        factors = {reference: 1.0, LONG_CONTEXT: 1.0} | {k: fitted[k] for k in containers}
        return dataclasses.replace(
            start_coeffs,
            **{n: float(v) for n, v in zip(names, values[: len(names)], strict=True)},
            gpu_clock={g: fitted[GPU_PREFIX + g] for g in gpus},
            fit={"containers": factors, "reference_container": reference},
        )

    def objective(vector: np.ndarray) -> np.ndarray:
        prior = vector[len(names) :] * scale[len(names) :] / CONTAINER_PRIOR_SIGMA * ROW_SCALE
        return np.concatenate([residuals(cases, build(vector)), prior])

    result = least_squares(
        objective,
        start,
        bounds=(lower / scale, upper / scale),
        loss="soft_l1",
        f_scale=ROW_SCALE,
        max_nfev=200,
    )
    return build(result.x)


def load_cases() -> list[PerfCase]:
    cases, _ = perf_cases(str(REFERENCE / "perf_summary.csv"), str(REFERENCE / "perf_recipes.csv"))
    long_context, _ = long_context_cases(str(REFERENCE / "long_context.csv"))
    return cases + long_context


def by_family(cases: list[PerfCase]) -> dict[str, list[PerfCase]]:
    families: dict[str, list[PerfCase]] = {}
    for case in cases:
        families.setdefault(case.run.hardware.architecture, []).append(case)
    return families


def mape(cases: list[PerfCase], fitted: dict[str, TimeCoefficients]) -> float:
    errors = [abs(predicted_tflops(c, fitted[c.run.hardware.architecture]) / c.published_tflops - 1) for c in cases]
    return 100 * float(np.mean(errors)) if errors else 0.0


def leave_one_model_out(cases: list[PerfCase], fitted: dict[str, TimeCoefficients]) -> float:
    """Refit without each model, predict it; prints per-model MAPE, returns the row-weighted MAPE.
    Families a refit has no rows for keep the full fit's coefficients."""
    weighted, count = 0.0, 0
    for name in sorted({c.model_name for c in cases}):
        train = [c for c in cases if c.model_name != name]
        held = [c for c in cases if c.model_name == name]
        refit = {family: fit_family(rows) for family, rows in by_family(train).items()}
        for family in fitted:
            refit.setdefault(family, fitted[family])
        err = mape(held, refit)
        print(f"  leave out {name:18s} n={len(held):3d} MAPE {err:6.2f}%")
        weighted += err * len(held)
        count += len(held)
    return weighted / count if count else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--lomo", action="store_true", help="also leave-one-model-out (slow)")
    args = parser.parse_args(argv)
    cases = load_cases()
    fitted = {family: fit_family(rows) for family, rows in by_family(cases).items()}
    moe = [c for c in cases if c.run.model.is_moe]
    for family, coefficients in fitted.items():
        print(family, {n: round(getattr(coefficients, n), 5) for n in BOUNDS})
        print("  sustained clock vs", REFERENCE_GPUS, {k: round(v, 3) for k, v in coefficients.gpu_clock.items()})
        print(
            "  container factors vs",
            coefficients.fit["reference_container"],
            {k: round(v, 3) for k, v in coefficients.fit["containers"].items()},
        )
    summary = {"n": len(cases), "n_moe": len(moe), "mape_all": mape(cases, fitted), "mape_moe": mape(moe, fitted)}
    print(f"fit MAPE all {summary['mape_all']:.2f}% (n={len(cases)}), MoE {summary['mape_moe']:.2f}% (n={len(moe)})")
    if args.lomo:
        summary["lomo_mape"] = leave_one_model_out(cases, fitted)
        print(f"leave-one-model-out MAPE {summary['lomo_mape']:.2f}%")
    if args.write:
        payload = {
            "families": {family: {n: float(getattr(c, n)) for n in BOUNDS} for family, c in fitted.items()},
            "gpu_clocks": {family: dict(c.gpu_clock) for family, c in fitted.items()},
            "containers": {family: dict(c.fit["containers"]) for family, c in fitted.items()},
            "reference_containers": {family: c.fit["reference_container"] for family, c in fitted.items()},
            "fit": {
                "date": dt.date.today().isoformat(),
                "script": "benchmarks/fit_time.py",
                "data": ["perf_summary.csv + perf_recipes.csv", "long_context.csv"],
                **summary,
            },
        }
        write_coefficients(OUTPUT, payload, script="benchmarks/fit_time.py")
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
