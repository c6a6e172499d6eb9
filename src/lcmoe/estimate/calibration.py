"""Refit the time model's efficiencies from a user's own measured runs (``lcmoe calibrate``).

A calibration scales groups of the shipped coefficients (time.py ``TimeCoefficients``):
- ``compute``: dense-GEMM (every precision), grouped-GEMM and attention efficiencies;
- ``communication``: EP NVLink / network efficiencies and the NVLink / scale-out link efficiencies.
One run fixes one number, so one run fits a single scale shared by both groups; two or more
distinct runs fit the two groups separately. The fit is a maximum a posteriori estimate:
Σ log(predicted/measured)² / σ_run² + Σ log(scale)² / σ_cluster², where σ_cluster is how far a
(model, GPU) group's mean error strays from the shipped model and σ_run how far one run strays
from its group's mean — both measured on the shared perf data (``benchmarks/calibration_gain.py
--prior``: 0.065 and 0.122 in log units). One run therefore moves the model about a fifth of
the way to it; many runs move it all the way. Scaled efficiencies are clipped to the measured
ceilings (``COEFFICIENT_BOUNDS``, kernels-and-links.md §8), so a calibration can never claim
more than the hardware delivers.

The search is coordinate-wise golden section on log(scale) ∈ [log 0.2, log 5]; it needs no numpy
or scipy, and each evaluation only re-combines cached amounts (time.py ``combine``)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.estimate.time import (
    COEFFICIENT_BOUNDS,
    RunAmounts,
    TimeCoefficients,
    coefficients_from_values,
    combine,
    shipped_time_coefficients,
    time_amounts,
)
from lcmoe.run import RunConfig
from lcmoe.specs.hardware import HardwareSpec

GROUPS: dict[str, tuple[str, ...]] = {
    "compute": (
        "gemm_efficiency_bf16",
        "gemm_efficiency_fp8",
        "gemm_efficiency_mxfp8",
        "gemm_efficiency_fp4",
        "grouped_gemm_efficiency",
        "attention_efficiency",
    ),
    "communication": ("ep_comm_efficiency", "ep_network_efficiency", "nvlink_efficiency", "scaleout_efficiency"),
}
CLUSTER_SIGMA = 0.065  # spread of per-(model, GPU) mean log error, shared perf data
RUN_SIGMA = 0.122  # spread of one run's log error around its group's mean
LOG_SCALE_LIMIT = math.log(5.0)
FORMAT = "lcmoe-calibration/1"


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    run: RunConfig
    step_seconds: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class Calibration:
    architecture: str
    hardware: str
    scales: dict[str, float]
    coefficients: TimeCoefficients
    runs: list[dict[str, Any]]
    mape_before: float
    mape_after: float

    def as_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self.coefficients, f.name) for f in fields(TimeCoefficients) if f.name != "fit"}
        return {
            "format": FORMAT,
            "created": dt.date.today().isoformat(),
            "architecture": self.architecture,
            "hardware": self.hardware,
            "scales": self.scales,
            "coefficients": values,
            "runs": self.runs,
            "fit": {"n": len(self.runs), "mape_before": self.mape_before, "mape_after": self.mape_after},
        }


def scaled(base: TimeCoefficients, scales: dict[str, float]) -> TimeCoefficients:
    """``base`` with each group's efficiencies multiplied by its scale, clipped to the ceilings."""
    changes: dict[str, Any] = {}
    for group, scale in scales.items():
        for name in GROUPS[group]:
            low, high = COEFFICIENT_BOUNDS.get(name, (0.01, 1.0))
            changes[name] = min(high, max(low, getattr(base, name) * scale))
    return replace(base, **changes)


def _residuals(amounts: Sequence[RunAmounts], measured: Sequence[float], c: TimeCoefficients) -> list[float]:
    return [math.log(combine(a, c).step_seconds / m) for a, m in zip(amounts, measured, strict=True)]


def _mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    return 100 * sum(abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)) / len(measured)


def _golden(f: Any, low: float, high: float, iterations: int = 40) -> float:
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def measured_architecture(measured: Sequence[MeasuredRun]) -> str:
    """The one hardware family of ``measured`` (a calibration is one cluster's)."""
    if not measured:
        raise LcmoeError("LOG", None, "gave no measured step time", "pass logs with iteration lines")
    families = {m.run.hardware.architecture for m in measured}
    if len(families) > 1:
        raise LcmoeError(
            "LOG", ", ".join(sorted(families)), "mixes hardware families", "calibrate one cluster at a time"
        )
    return families.pop()


def fitted_group_scales(
    amounts: Sequence[RunAmounts], steps: Sequence[float], base: TimeCoefficients, names: list[str]
) -> dict[str, float]:
    """Each GROUPS scale (one shared ``all`` scale when ``names`` is ["all"]) minimising the runs'
    log misfit (RUN_SIGMA) plus a prior pull to 1 (CLUSTER_SIGMA), by golden-section search per
    scale in log space, four sweeps when there are two scales."""
    log_scales = dict.fromkeys(names, 0.0)

    def expand(values: dict[str, float]) -> dict[str, float]:
        if "all" in values:
            return dict.fromkeys(GROUPS, math.exp(values["all"]))
        return {k: math.exp(v) for k, v in values.items()}

    def objective(values: dict[str, float]) -> float:
        residuals = _residuals(amounts, steps, scaled(base, expand(values)))
        misfit = sum(r * r for r in residuals) / RUN_SIGMA**2
        return misfit + sum(v * v for v in values.values()) / CLUSTER_SIGMA**2

    for _ in range(4 if len(names) > 1 else 1):
        for name in names:

            def along(x: float, name: str = name) -> float:
                return objective({**log_scales, name: x})

            log_scales[name] = _golden(along, -LOG_SCALE_LIMIT, LOG_SCALE_LIMIT)
    return expand(log_scales)


def calibrate(measured: Sequence[MeasuredRun], base: TimeCoefficients | None = None) -> Calibration:
    """Fit group scales to ``measured`` (one hardware family): one ``all`` scale from a single
    distinct run, compute and communication apart from two or more (``fitted_group_scales``)."""
    architecture = measured_architecture(measured)
    base = base or shipped_time_coefficients(architecture)
    amounts = [time_amounts(m.run) for m in measured]
    steps = [m.step_seconds for m in measured]
    distinct = len({(m.run.model.name, m.run.layout, m.run.options) for m in measured})
    scales = fitted_group_scales(amounts, steps, base, ["compute", "communication"] if distinct >= 2 else ["all"])
    fitted = scaled(base, scales)
    after = [combine(a, fitted).step_seconds for a in amounts]
    before = [combine(a, base).step_seconds for a in amounts]
    mape_after = _mape(after, steps)
    fitted = replace(fitted, fit={"mape_all": mape_after, "calibrated_from": len(measured)})
    runs = [
        {
            "source": m.source,
            "model": m.run.model.name,
            "gpus": m.run.num_gpus,
            "seq_len": m.run.options.seq_len,
            "measured_step_seconds": m.step_seconds,
            "predicted_before_seconds": b,
            "predicted_after_seconds": a,
        }
        for m, b, a in zip(measured, before, after, strict=True)
    ]
    return Calibration(
        architecture=architecture,
        hardware=measured[0].run.hardware.name,
        scales=scales,
        coefficients=fitted,
        runs=runs,
        mape_before=_mape(before, steps),
        mape_after=mape_after,
    )


# Ranges of the coefficients COEFFICIENT_BOUNDS (time.py) leaves open, for a calibration file
# read from disk (issue #31: an efficiency of 0 divided by zero, 5.0 or NaN ranked plans on
# nonsense). Fractions of a time hidden or saved lie in [0, 1]; the rest are positive rates or
# sizes, bounded at 10× the shipped value's order of magnitude:
EXTRA_BOUNDS: dict[str, tuple[float, float]] = {
    "tp_overlap_hidden": (0.0, 1.0),
    "dp_exposed_fraction": (0.0, 1.0),
    "cuda_graph_overhead_saving": (0.0, 1.0),
    "grouped_gemm_half_tokens": (1.0, 1.0e6),  # shipped 512 tokens
    "attention_half_chunk": (1.0, 1.0e6),  # shipped 1024 tokens
    "elementwise_traffic_factor": (0.1, 100.0),  # shipped 3 passes
    "host_adam_params_per_second": (1.0e6, 1.0e13),  # shipped 6.5e8 params/s
    "grouped_gemm_half_size_bf16": (0.0, 5.0e7),  # as grouped_gemm_half_size; 0: the same one
}
# Coefficients added after calibration files were first written: an older file takes the
# shipped family's value (load_calibration).
SHIPPED_WHEN_MISSING = ("grouped_gemm_half_size_bf16",)
# A sustained clock relative to the family's reference GPU (fit_time.py: 0.7-1.2 fitted).
GPU_CLOCK_BOUNDS = (0.1, 10.0)


def _finite(value: object, *, field: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise LcmoeError(f"--calibration {path}: {field}", value, "must be a number", "re-run lcmoe calibrate")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise LcmoeError(
            f"--calibration {path}: {field}", value, "must be a number", "re-run lcmoe calibrate"
        ) from None
    if not math.isfinite(number):
        raise LcmoeError(f"--calibration {path}: {field}", value, "must be a finite number", "re-run lcmoe calibrate")
    return number


def _checked_coefficients(values: object, path: str) -> dict[str, Any]:
    """The calibration's coefficients, each a finite number inside its physical range."""
    if not isinstance(values, dict):
        raise LcmoeError(f"--calibration {path}: coefficients", values, "must be a mapping", "re-run lcmoe calibrate")
    known = {f.name for f in fields(TimeCoefficients)} - {"fit"}
    checked: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            continue  # coefficients_from_values ignores unknown names; so do we
        if name == "gpu_clock":
            if not isinstance(value, dict):
                raise LcmoeError(f"--calibration {path}: gpu_clock", value, "must be a mapping", "re-run calibrate")
            clocks = {}
            for gpu, clock in value.items():
                number = _finite(clock, field=f"gpu_clock.{gpu}", path=path)
                if not GPU_CLOCK_BOUNDS[0] <= number <= GPU_CLOCK_BOUNDS[1]:
                    raise LcmoeError(
                        f"--calibration {path}: gpu_clock.{gpu}",
                        clock,
                        f"must be between {GPU_CLOCK_BOUNDS[0]:g} and {GPU_CLOCK_BOUNDS[1]:g}",
                        "re-run lcmoe calibrate",
                    )
                clocks[str(gpu)] = number
            checked[name] = clocks
            continue
        number = _finite(value, field=name, path=path)
        low, high = COEFFICIENT_BOUNDS.get(name) or EXTRA_BOUNDS.get(name) or (0.0, math.inf)
        if not low <= number <= high:
            raise LcmoeError(
                f"--calibration {path}: {name}",
                value,
                f"must be between {low:g} and {high:g} (the measured range of this coefficient)",
                "re-run lcmoe calibrate",
            )
        checked[name] = number
    return checked


def load_calibration(path: str | Path) -> Calibration:
    """Read a cluster.yaml written by ``lcmoe calibrate``; every coefficient must be finite and
    inside its range (COEFFICIENT_BOUNDS, EXTRA_BOUNDS), every scale within the fit's [0.2, 5]."""
    from lcmoe.catalog import read_yaml_file

    data = read_yaml_file(path, field="--calibration")
    if data.get("format") != FORMAT:
        raise LcmoeError("--calibration", str(path), f"is not an lcmoe calibration ({FORMAT})", "run lcmoe calibrate")
    where = str(path)
    coefficients = _checked_coefficients(data.get("coefficients") or {}, where)
    scales_in = data.get("scales") or {}
    if not isinstance(scales_in, dict):
        raise LcmoeError(f"--calibration {where}: scales", scales_in, "must be a mapping", "re-run lcmoe calibrate")
    scales = {str(k): _finite(v, field=f"scales.{k}", path=where) for k, v in scales_in.items()}
    for key, scale in scales.items():
        if not math.exp(-LOG_SCALE_LIMIT) * 0.999 <= scale <= math.exp(LOG_SCALE_LIMIT) * 1.001:
            raise LcmoeError(
                f"--calibration {where}: scales.{key}", scale, "must be between 0.2 and 5", "re-run lcmoe calibrate"
            )
    fit_in = data.get("fit") or {}
    if not isinstance(fit_in, dict):
        raise LcmoeError(f"--calibration {where}: fit", fit_in, "must be a mapping", "re-run lcmoe calibrate")
    fit = dict(fit_in)
    mape_before = _finite(fit.get("mape_before", 0.0), field="fit.mape_before", path=where)
    mape_after = _finite(fit.get("mape_after", 0.0), field="fit.mape_after", path=where)
    architecture = data.get("architecture")
    if architecture not in ("ampere", "hopper", "blackwell"):
        raise LcmoeError(
            f"--calibration {where}: architecture",
            architecture,
            "must be ampere, hopper or blackwell",
            "re-run lcmoe calibrate",
        )
    # A file written before a coefficient existed takes the shipped value, not the dataclass
    # default (a missing BF16 half-size would rate Hopper BF16 experts at the FP8 one).
    shipped = shipped_time_coefficients(architecture)
    for name in SHIPPED_WHEN_MISSING:
        coefficients.setdefault(name, getattr(shipped, name))
    runs = data.get("runs") or []
    if not isinstance(runs, list):
        raise LcmoeError(f"--calibration {where}: runs", runs, "must be a list", "re-run lcmoe calibrate")
    return Calibration(
        architecture=architecture,
        hardware=str(data.get("hardware", ""))[:200],
        scales=scales,
        coefficients=coefficients_from_values(coefficients, {"mape_all": fit.get("mape_after"), **fit}),
        runs=runs,
        mape_before=mape_before,
        mape_after=mape_after,
    )


def coefficients_for(hardware: HardwareSpec, calibration: Calibration | None) -> TimeCoefficients | None:
    """The calibration's coefficients when it was fitted on ``hardware``'s family, else an error."""
    if calibration is None:
        return None
    if calibration.architecture != hardware.architecture:
        raise LcmoeError(
            "--calibration",
            calibration.architecture,
            f"was fitted on {calibration.architecture} GPUs but the run is on {hardware.name} "
            f"({hardware.architecture})",
            "calibrate from runs on this GPU family",
        )
    return calibration.coefficients
