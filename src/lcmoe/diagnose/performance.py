"""Measured against predicted step time, where the time goes, and the next knob to try.

The prediction is ``estimate_time`` on the run's config (with a user calibration when given);
the comparison band is the larger of the log's own noise (3 standard errors of the median) and
the time model's fitted error for the hardware family (``fit.mape_all`` in
time_coefficients.yaml, or the calibration's). Knobs are evaluated, not just named: each is one
change to the run (remedies.py) with its predicted throughput and memory verdict."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lcmoe.diagnose import remedies
from lcmoe.diagnose.log_records import LogSummary
from lcmoe.diagnose.steps import StepStats
from lcmoe.estimate.time import TimeCoefficients, estimate_time, shipped_time_coefficients
from lcmoe.plan.search import recompute_ladder
from lcmoe.run import RunConfig

COMPUTE_TERMS = {"dense_gemm", "expert_gemm", "attention", "elementwise"}
STRAGGLER_SPREAD = 1.10  # timer max/min across ranks above this points at a slow rank


@dataclass(frozen=True, slots=True)
class SpeedDiagnosis:
    measured_step_seconds: float
    predicted_step_seconds: float
    ratio: float
    band: float
    verdict: str
    breakdown: dict[str, float]
    bottleneck: str
    notes: list[str]
    knobs: list[remedies.Outcome]

    def as_dict(self) -> dict[str, object]:
        return {
            "measured_step_seconds": self.measured_step_seconds,
            "predicted_step_seconds": self.predicted_step_seconds,
            "measured_over_predicted": self.ratio,
            "band": self.band,
            "verdict": self.verdict,
            "breakdown_seconds": self.breakdown,
            "bottleneck": self.bottleneck,
            "notes": self.notes,
            "knobs": [k.as_dict() for k in self.knobs],
        }


def model_error_band(run: RunConfig, coefficients: TimeCoefficients | None) -> float:
    c = coefficients or shipped_time_coefficients(run.hardware.architecture)
    mape = c.fit.get("mape_all") if isinstance(c.fit, dict) else None
    return float(mape) / 100.0 if isinstance(mape, (int, float)) else 0.15


def _knob_remedies(run: RunConfig, term: str) -> list[remedies.Remedy]:
    """The changes that shrink one term of the step (knob → rule id as in rules/advice.py)."""
    opt, lay = run.options, run.layout
    out: list[remedies.Remedy] = []
    if term == "ep_comm":
        out += [
            remedies.Remedy("dispatcher", f"dispatcher {d}", "LC-DISPATCHER", remedies.with_options(run, dispatcher=d))
            for d in ("deepep", "hybridep")
            if opt.dispatcher != d
        ]
        if not opt.overlap_moe_expert_parallel_comm and lay.ep > 1:
            overlapped = remedies.with_options(run, overlap_moe_expert_parallel_comm=True)
            out.append(remedies.Remedy("overlap", "overlap_moe_expert_parallel_comm", "LC-DISPATCHER", overlapped))
    elif term == "cp_comm":
        if lay.cp_comm_type != "a2a":
            a2a = replace(run, layout=replace(lay, cp_comm_type="a2a", hierarchical_context_parallel_sizes=None))
            out.append(remedies.Remedy("layout", "cp_comm_type a2a", "LC-CP-COMM", a2a))
        out.append(remedies.relayout(run, "tp"))
    elif term == "tp_comm":
        out.append(remedies.relayout(run, "tp", 0.5))
    elif term == "pipeline_bubble":
        out.append(remedies.virtual_pipeline(run))
    elif term == "pp_comm":
        out.append(remedies.relayout(run, "pp", 0.5))
    elif term == "recompute":
        for _, modules in recompute_ladder(run.model)[1:-1]:
            narrower = opt.recompute_granularity == "full" or modules < opt.recompute_modules
            if narrower:
                lighter = remedies.with_options(run, recompute_granularity="selective", recompute_modules=modules)
                out.append(
                    remedies.Remedy(
                        "recompute",
                        "selective recompute " + ",".join(sorted(modules)),
                        "LC-RECOMPUTE-SELECTIVE",
                        lighter,
                    )
                )
    elif term == "optimizer" and opt.optimizer_offload_fraction > 0:
        lower = max(0.0, opt.optimizer_offload_fraction - 0.25)
        fewer = remedies.with_options(run, optimizer_offload_fraction=lower)
        out.append(remedies.Remedy("offload", f"optimizer CPU offload fraction {lower:g}", "LC-OFFLOAD-128K", fewer))
    elif term == "overhead" and not opt.cuda_graph_scope and opt.recompute_granularity != "full":
        scope = frozenset({"attn", "moe_router", "moe_preprocess"} if run.model.is_moe else {"attn"})
        graphs = remedies.with_options(run, cuda_graph_scope=scope)
        out.append(remedies.Remedy("graphs", "CUDA graphs " + ",".join(sorted(scope)), "LC-CUDA-GRAPH-STATIC", graphs))
    elif term in COMPUTE_TERMS:
        out.append(remedies.low_precision(run))
    return out


def diagnose_speed(
    run: RunConfig,
    stats: StepStats,
    summary: LogSummary | None = None,
    *,
    coefficients: TimeCoefficients | None = None,
    margin: float = 0.05,
) -> SpeedDiagnosis:
    predicted = estimate_time(run, coefficients)
    ratio = stats.median_seconds / predicted.step_seconds
    noise = 3 * stats.median_error_seconds / stats.median_seconds
    band = max(noise, model_error_band(run, coefficients))
    if ratio > 1 + band:
        verdict = "slower than predicted"
    elif ratio < 1 - band:
        verdict = "faster than predicted"
    else:
        verdict = "as predicted"
    breakdown = dict(predicted.breakdown)
    overheads = {k: v for k, v in breakdown.items() if k not in COMPUTE_TERMS and v > 0}
    bottleneck = max(overheads, key=lambda k: overheads[k]) if overheads else max(breakdown, key=lambda k: breakdown[k])
    step = predicted.step_seconds
    ranked = sorted((k for k in breakdown if breakdown[k] > 0.05 * step), key=lambda k: -breakdown[k])
    knobs = _evaluated_knobs(
        run, [bottleneck, *ranked], predicted.tokens_per_sec_per_gpu, margin=margin, coefficients=coefficients
    )
    return SpeedDiagnosis(
        measured_step_seconds=stats.median_seconds,
        predicted_step_seconds=step,
        ratio=ratio,
        band=band,
        verdict=verdict,
        breakdown=breakdown,
        bottleneck=bottleneck,
        notes=_speed_notes(run, stats, summary, verdict=verdict, ratio=ratio),
        knobs=knobs,
    )


def _speed_notes(
    run: RunConfig, stats: StepStats, summary: LogSummary | None, *, verdict: str, ratio: float
) -> list[str]:
    """What the verdict means, and what in the log the model does not see (a batch size that
    differs from the config's, a straggler across ranks, skipped NaN iterations)."""
    notes = []
    if verdict == "slower than predicted":
        notes.append(
            f"{100 * (ratio - 1):.0f}% slower than the model: beyond it — routing imbalance without forced "
            "balance, a slow rank or link, data loading, or a container older than the one the model was fitted on "
            "(LC-CONTAINER); if every run on this cluster is off by the same factor, `lcmoe calibrate` it"
        )
    elif verdict == "faster than predicted":
        notes.append(f"{100 * (1 - ratio):.0f}% faster than the model; `lcmoe calibrate` this cluster")
    if stats.global_batch_size is not None and stats.global_batch_size != run.layout.gbs:
        notes.append(f"the log's global batch size is {stats.global_batch_size} but the config's is {run.layout.gbs}")
    if summary is not None:
        spread = summary.timers.get("forward-backward")
        if spread and spread[0] > 0 and spread[1] / spread[0] > STRAGGLER_SPREAD:
            notes.append(
                f"forward-backward takes {spread[0]:.0f}–{spread[1]:.0f} ms across ranks: a straggler or imbalance"
            )
    if stats.nan_iterations:
        notes.append(f"{stats.nan_iterations} NaN iterations were skipped")
    return notes


def _evaluated_knobs(
    run: RunConfig,
    terms: list[str],
    baseline_tokens_per_s: float,
    *,
    margin: float,
    coefficients: TimeCoefficients | None,
) -> list[remedies.Outcome]:
    """The legal changes that shrink ``terms`` (largest first) and speed the run up by more than
    0.5%, each evaluated once; those that fit first, then by throughput gain."""
    seen: set[str] = set()
    knobs = []
    for remedy in (r for term in terms for r in _knob_remedies(run, term)):
        if remedy.label in seen:
            continue
        seen.add(remedy.label)
        outcome = remedies.evaluate(remedy, baseline_tokens_per_s, margin=margin, coefficients=coefficients)
        if outcome and outcome.legal and outcome.throughput_change > 0.005:
            knobs.append(outcome)
    knobs.sort(key=lambda o: (not o.fits, -o.throughput_change))
    return knobs
