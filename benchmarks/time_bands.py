"""Uncertainty bands of the step-time model: the evidence table, the fitted band weights and the
band's coverage under leave-one-model-out (LOMO).

1. The measured runs are the rows the time fit uses (``fit_time.load_cases``: perf_summary.csv ⋈
   perf_recipes.csv and long_context.csv). Each model is left out in turn, the time model is refit
   on the others (``fit_time.fit_families``) and the left-out rows are predicted: that is each
   run's LOMO error, e = 100·(measured / predicted − 1).
2. The band formula (``lcmoe.estimate.band``: Q_q of the k nearest runs' |e| plus Σ w_i·d_i to the
   nearest run) is fitted on those errors so that, for every run, the band computed from the
   *other* models' runs holds its LOMO error at least ``TARGET_COVERAGE`` of the time: a pinball
   (quantile) loss at ``PINBALL_LEVEL`` over the runs, plus a log-normal prior on each weight
   (``PRIOR_WEIGHTS_PCT``, width ``PRIOR_SIGMA``) so that a distance the data never shows keeps
   its prior instead of collapsing onto 0; q is fitted with them, k is fixed (``NEIGHBOURS``).
3. Reported: coverage and median band in-sample (weights fitted on every model) and nested
   (weights refit without the model whose runs are scored), per model, and the fitted weights.

    pip install '.[bench]'
    python benchmarks/time_bands.py [--write] [--json OUT] [--cache FILE]

``--write`` stores src/lcmoe/data/time_evidence.yaml (the CLI's evidence). The LOMO refits take a
few minutes; ``--cache FILE`` keeps their errors keyed by the inputs' hashes, so re-running after
changing only the band fit is instant. Re-run it whenever the time model or its data change.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from scipy.optimize import differential_evolution

from benchmarks.published import REFERENCE, REPO, write_coefficients, write_json
from lcmoe.estimate.band import (
    DIMENSIONS,
    BandParameters,
    EvidenceRun,
    RunDescriptor,
    describe_run,
    distances,
)
from lcmoe.run import RunConfig

OUTPUT = REPO / "src" / "lcmoe" / "data" / "time_evidence.yaml"
DATA_FILES = ("perf_summary.csv", "perf_recipes.csv", "long_context.csv")
# Files whose change changes the LOMO errors (the cache key).
SOURCES = (
    "benchmarks/fit_time.py",
    "benchmarks/perf_rows.py",
    "benchmarks/published.py",
    "src/lcmoe/estimate/time",  # the package: every module in it
    "src/lcmoe/data/time_coefficients.yaml",
)

TARGET_COVERAGE = 0.80
TARGET_MEDIAN_PCT = 20.0
# The pinball level: above the target, so that the band keeps its coverage on the nested check
# (weights fitted without the scored model) too. On the 2026-12 data: level 0.85 gave 80-83%
# in-sample; 0.90 with PRIOR_RUNS 20 gave 85% in-sample but 70% nested (the weights then follow
# whichever models are in); 0.93 with PRIOR_RUNS 100: 84.5% and 81.8%, median band 16.5% both.
# On the 15-parameter time model (2026-12-07): 0.88 / 0.90 / 0.91 / 0.92 / 0.93 gave 86.2% in-sample
# at every level up to 0.92 (median 15.2-15.4%) and 75.7 / 79.0 / 79.6 / 80.1 / 81.8% nested; 0.93's
# in-sample median band was 24.1%. 0.92 is the lowest level that keeps both checks at 80%.
# On the 12-parameter time model (2026-12-07, round 5): 0.88 / 0.90 / 0.91 / 0.92 gave 85.1 / 85.6 /
# 85.6 / 91.2% in-sample (median band 16.1 / 16.1 / 16.3 / 24.0%) and 77.9 / 79.0 / 82.3 / 82.3%
# nested (13.3 / 13.9 / 17.0 / 17.0%): 0.91 meets both targets on both checks.
PINBALL_LEVEL = 0.91
# k: about one (model, GPU) group of runs (the data has 31 groups of 1-16 runs); 10 and 40 fit
# the pinball loss no better.
NEIGHBOURS = 20
# Prior weights, percent of tokens/s per unit distance, and their log-normal width (a factor e):
# changing the mixer or dense/MoE kind costs 10% (the LOMO error of a model whose mixer no other
# fitted model has, README "Step time"); another GPU family 5%, another GPU of the family half
# that; each doubling of TP, of the per-rank attention chunk or of the EP span over NVLink
# domains 3%, of the sequence length 2%.
PRIOR_WEIGHTS_PCT = {"kind": 10.0, "gpu": 5.0, "tp": 3.0, "chunk": 3.0, "ep_span": 3.0, "seq": 2.0}
PRIOR_SIGMA = 1.0
# The prior weighs as much as this many runs in the mean pinball loss.
PRIOR_RUNS = 100
# Search bounds: weights in log space (percent per unit distance), q; none may end within 1% of
# its span from a bound.
WEIGHT_BOUNDS_PCT = (0.05, 60.0)
QUANTILE_BOUNDS = (0.3, 1.0)


# ----- 1. LOMO errors ------------------------------------------------------------------------------
def _inputs_hash() -> str:
    digest = hashlib.sha256()
    for rel in SOURCES:
        path = REPO / rel
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.read_bytes() if file.exists() else b"")
    for name in DATA_FILES:
        path = REFERENCE / name
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def lomo_evidence() -> list[EvidenceRun]:
    """Every fitted row with its LOMO error (a refit per model; minutes)."""
    from benchmarks.fit_time import fit_families, load_cases, predicted_tflops

    cases = load_cases()
    runs: list[EvidenceRun] = []
    for name in sorted({c.model_name for c in cases}):
        held = [c for c in cases if c.model_name == name]
        refit = fit_families([c for c in cases if c.model_name != name])
        for case in held:
            family = case.run.hardware.architecture
            if family not in refit:  # no other model on this family: nothing predicts it
                continue
            predicted = predicted_tflops(case, refit[family])
            error = 100 * (case.published_tflops / predicted - 1)
            runs.append(EvidenceRun(_run_name(case.name, case.run), case.model_name, describe_run(case.run), error))
        print(f"  LOMO {name:32s} n={len(held):3d}", flush=True)
    return _unique_names(runs)


def _run_name(label: str, run: RunConfig) -> str:
    """The published row's label with the layout it ran (labels alone repeat across rows)."""
    lay = run.layout
    return (
        f"{label} · TP{lay.tp} CP{lay.cp} EP{lay.ep} PP{lay.pp} VPP{lay.vpp} MBS{lay.mbs} GBS{lay.gbs} "
        f"{run.options.seq_len // 1024}K"
    )


def _unique_names(runs: list[EvidenceRun]) -> list[EvidenceRun]:
    """Rows still sharing a name get #2, #3, … (the same recipe published twice)."""
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        out.append(dataclasses.replace(run, name=f"{run.name} #{seen[run.name]}") if seen[run.name] > 1 else run)
    return out


def _to_json(runs: Sequence[EvidenceRun]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "model": r.model, **r.descriptor.as_dict(), "lomo_error_pct": float(r.error_pct)} for r in runs
    ]


def _from_json(rows: Sequence[dict[str, Any]]) -> list[EvidenceRun]:
    keys = RunDescriptor.__dataclass_fields__
    return [
        EvidenceRun(row["name"], row["model"], RunDescriptor(**{k: row[k] for k in keys}), row["lomo_error_pct"])
        for row in rows
    ]


def cached_lomo_evidence(cache: Path | None) -> list[EvidenceRun]:
    key = _inputs_hash()
    if cache and cache.exists():
        stored = json.loads(cache.read_text(encoding="utf-8"))
        if stored.get("key") == key:
            print(f"LOMO errors from {cache} (inputs unchanged)")
            return _from_json(stored["runs"])
    runs = lomo_evidence()
    if cache:
        write_json(cache, {"key": key, "runs": _to_json(runs)})
    return runs


# ----- 2. band fit ---------------------------------------------------------------------------------
class _Table:
    """Pairwise distances (n × n × dims) and |errors|, computed once for the fit."""

    def __init__(self, runs: Sequence[EvidenceRun]) -> None:
        self.runs = list(runs)
        self.models = np.array([r.model for r in runs])
        self.names = sorted({r.model for r in runs})  # plain str (YAML keys)
        self.abs_errors = np.array([abs(r.error_pct) for r in runs])
        self.d = np.array([[distances(a.descriptor, b.descriptor) for b in runs] for a in runs])

    def bands(self, weights: np.ndarray, k: int, q: float, evidence_mask: np.ndarray | None = None) -> np.ndarray:
        """Each run's band from the other models' runs (and, with ``evidence_mask``, only those):
        ``band.time_band`` vectorised (the same nearest run on ties: the earlier one)."""
        pen = self.d @ weights  # n × n
        allowed = self.models[None, :] != self.models[:, None]
        if evidence_mask is not None:
            allowed &= evidence_mask[None, :]
        pen = np.where(allowed, pen, np.inf)
        order = np.argsort(pen, axis=1, kind="stable")
        nearest = np.take_along_axis(pen, order[:, :1], axis=1)[:, 0]
        counts = allowed.sum(axis=1)
        base = np.empty(len(pen))
        for size in np.unique(np.minimum(counts, k)):
            rows = np.minimum(counts, k) == size
            base[rows] = np.quantile(self.abs_errors[order[rows, :size]], q, axis=1)
        return np.asarray(base + nearest)


def _prior(name: str) -> float:
    return float(np.log(PRIOR_WEIGHTS_PCT[name]))


def _loss(x: np.ndarray, table: _Table, rows: np.ndarray, evidence: np.ndarray) -> float:
    """Mean pinball loss at PINBALL_LEVEL of |LOMO error| against the band over ``rows``, plus
    the log-normal prior on the weights (counted as PRIOR_RUNS runs). x = (log w_i…, q)."""
    theta, q = x[: len(DIMENSIONS)], float(x[-1])
    bands = table.bands(np.exp(theta), NEIGHBOURS, q, evidence)[rows]
    gap = table.abs_errors[rows] - bands
    pinball = np.where(gap >= 0, PINBALL_LEVEL * gap, (PINBALL_LEVEL - 1) * gap)
    prior = np.array([_prior(n) for n in DIMENSIONS])
    return float(np.mean(pinball) + PRIOR_RUNS * 0.5 * np.sum(((theta - prior) / PRIOR_SIGMA) ** 2) / len(rows))


def fit_band(table: _Table, rows: np.ndarray | None = None) -> BandParameters:
    """The weights and q minimising ``_loss`` on ``rows`` (all runs by default), the evidence
    being those rows' runs only (a nested fit never sees the scored model). The loss is piecewise
    linear (the nearest run changes with the weights), so a seeded differential evolution searches
    it rather than a gradient method."""
    rows = np.arange(len(table.runs)) if rows is None else rows
    evidence = np.zeros(len(table.runs), dtype=bool)
    evidence[rows] = True
    low, high = (float(np.log(b)) for b in WEIGHT_BOUNDS_PCT)
    result = differential_evolution(
        _loss,
        [(low, high)] * len(DIMENSIONS) + [QUANTILE_BOUNDS],
        args=(table, rows, evidence),
        seed=0,
        maxiter=60,
        popsize=10,
        tol=1e-6,
        polish=False,
    )
    weights = tuple(float(w) for w in np.exp(result.x[: len(DIMENSIONS)]))
    return BandParameters(weights, NEIGHBOURS, float(result.x[-1]))


def at_bound(params: BandParameters) -> list[str]:
    """The fitted values within 1% of their search span from a bound."""
    low, high = (float(np.log(b)) for b in WEIGHT_BOUNDS_PCT)
    out = [
        f"{name}={w:.3g}"
        for name, w in zip(DIMENSIONS, params.weights_pct, strict=True)
        if min(np.log(w) - low, high - np.log(w)) < 0.01 * (high - low)
    ]
    q_low, q_high = QUANTILE_BOUNDS
    if min(params.quantile - q_low, q_high - params.quantile) < 0.01 * (q_high - q_low):
        out.append(f"q={params.quantile:.3g}")
    return out


# ----- 3. coverage ---------------------------------------------------------------------------------
def coverage(table: _Table, bands: np.ndarray, rows: np.ndarray | None = None) -> tuple[float, float]:
    """(share of runs whose |LOMO error| ≤ band, median band) over ``rows``."""
    rows = np.arange(len(table.runs)) if rows is None else rows
    inside = table.abs_errors[rows] <= bands[rows] + 1e-9
    return float(np.mean(inside)), float(np.median(bands[rows]))


def nested_bands(table: _Table) -> np.ndarray:
    """Each model's runs banded with weights fitted without that model (the honest check)."""
    out = np.empty(len(table.runs))
    for model in table.names:
        held = table.models == model
        params = fit_band(table, np.flatnonzero(~held))
        bands = table.bands(np.array(params.weights_pct), params.neighbours, params.quantile, ~held)
        out[held] = bands[held]
    return out


def summarise(runs: Sequence[EvidenceRun], fast: bool = False) -> tuple[BandParameters, dict[str, Any]]:
    table = _Table(runs)
    params = fit_band(table)
    bands = table.bands(np.array(params.weights_pct), params.neighbours, params.quantile)
    cov, med = coverage(table, bands)
    summary: dict[str, Any] = {
        "runs": len(runs),
        "models": len(table.names),
        "lomo_mape_pct": float(np.mean(table.abs_errors)),
        "coverage": cov,
        "median_band_pct": med,
        "per_model": {},
    }
    nested = None if fast else nested_bands(table)
    if nested is not None:
        summary["nested_coverage"], summary["nested_median_band_pct"] = coverage(table, nested)
    for model in table.names:
        rows = np.flatnonzero(table.models == model)
        c, m = coverage(table, bands, rows)
        entry = {
            "n": len(rows),
            "lomo_mape_pct": float(np.mean(table.abs_errors[rows])),
            "coverage": c,
            "median_band_pct": m,
        }
        if nested is not None:
            entry["nested_coverage"], entry["nested_median_band_pct"] = coverage(table, nested, rows)
        summary["per_model"][model] = entry
    return params, summary


def report(params: BandParameters, summary: dict[str, Any]) -> None:
    weights = ", ".join(f"{n} {w:.2f}" for n, w in zip(DIMENSIONS, params.weights_pct, strict=True))
    print(f"band = Q_{params.quantile:g}(|LOMO error| of the {params.neighbours} nearest runs) + Σ w·d")
    print(f"  weights (% per unit distance): {weights}")
    bound = at_bound(params)
    print(f"  weights within 1% of a bound {WEIGHT_BOUNDS_PCT}: {', '.join(bound) if bound else 'none'}")
    header = ("LOMO MAPE", "coverage", "median band", "nested cov", "nested med")
    print(f"{'model':32s} {'n':>3s} " + " ".join(f"{h:>11s}" for h in header))
    for model, e in summary["per_model"].items():
        nested = (
            f"{100 * e['nested_coverage']:10.0f}% {e['nested_median_band_pct']:10.1f}%"
            if "nested_coverage" in e
            else ""
        )
        print(
            f"{model:32s} {e['n']:3d} {e['lomo_mape_pct']:10.1f}% {100 * e['coverage']:10.0f}% "
            f"{e['median_band_pct']:10.1f}% {nested}"
        )
    print(
        f"all runs: n={summary['runs']}, LOMO MAPE {summary['lomo_mape_pct']:.1f}%; "
        f"coverage {100 * summary['coverage']:.1f}% (target ≥ {100 * TARGET_COVERAGE:.0f}%), "
        f"median band {summary['median_band_pct']:.1f}% (target ≤ {TARGET_MEDIAN_PCT:.0f}%)"
    )
    if "nested_coverage" in summary:
        print(
            f"nested (weights refit without the scored model): coverage {100 * summary['nested_coverage']:.1f}%, "
            f"median band {summary['nested_median_band_pct']:.1f}%"
        )


def evidence_document(runs: Sequence[EvidenceRun], params: BandParameters, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "summary": {
            "date": dt.date.today().isoformat(),
            "script": "benchmarks/time_bands.py",
            "data": list(DATA_FILES),
            "formula": "band_pct = Q_q(|lomo_error_pct| of the k nearest runs) + sum_i w_i * d_i(nearest run)",
            **{k: v for k, v in summary.items() if k != "per_model"},
            "per_model": summary["per_model"],
        },
        "band": {
            "neighbours": params.neighbours,
            "quantile": params.quantile,
            "weights_pct": dict(zip(DIMENSIONS, params.weights_pct, strict=True)),
            "prior_weights_pct": PRIOR_WEIGHTS_PCT,
            "prior_runs": PRIOR_RUNS,
            "pinball_level": PINBALL_LEVEL,
        },
        "runs": _to_json(runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT.relative_to(REPO)}")
    parser.add_argument("--json", dest="json_out", help="write the coverage figures and weights as JSON")
    parser.add_argument("--cache", type=Path, help="keep the LOMO errors here, keyed by the inputs")
    parser.add_argument("--fast", action="store_true", help="skip the nested (refit-per-model) coverage")
    args = parser.parse_args(argv)
    runs = cached_lomo_evidence(args.cache)
    params, summary = summarise(runs, fast=args.fast)
    report(params, summary)
    document = evidence_document(runs, params, summary)
    if args.json_out:
        write_json(args.json_out, {"summary": document["summary"], "band": document["band"]})
    if args.write:
        write_coefficients(OUTPUT, document, script="benchmarks/time_bands.py")
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    ok = summary["coverage"] >= TARGET_COVERAGE and summary["median_band_pct"] <= TARGET_MEDIAN_PCT
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
