"""Why a run ran out of memory, and the cheapest change that makes it fit.

The estimator is run on the run's own config: every pipeline stage whose predicted reserved peak
exceeds the GPU is reported with its largest components. The log adds evidence (the OOM message's
request, free memory and reserved-but-unallocated bytes; measured peaks before the failure).

The remediation ladder follows the guidance's order of intrusiveness (long-context-guidance.md;
facts §6.4, §6.6, §6.7): allocator setting, selective recompute from the narrowest set to the
widest (LC-RECOMPUTE-SELECTIVE), full recompute, FP8 (LC-PRECISION), optimizer CPU offload
(LC-OFFLOAD-128K, alone or with the narrowest selective set that then fits), one parallel size
doubled (CP, PP, EP, TP), and finally more GPUs (the planner's smallest GPU count that fits). Each
rung is one change to the failing config, evaluated for legality, memory and throughput, and
judged against that config (``judge``): a rung is offered only when it is legal, lowers the
predicted peak, fits under the margin and lowers the peak by at least what the log's failed
allocation lacked; every other rung is listed as rejected with the test it failed. The
recommendation is the first offered rung, and the fastest offered rung is named when it is not
the same."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lcmoe.diagnose import remedies
from lcmoe.diagnose.log_records import LogSummary
from lcmoe.estimate.memory import MemoryEstimate, estimate_memory
from lcmoe.estimate.time import TimeCoefficients, estimate_time
from lcmoe.plan.search import PlanRequest, min_gpus_that_fit, recompute_ladder
from lcmoe.run import RunConfig

GIB = 1024.0**3
FRAGMENTATION_EVIDENCE = 0.05  # reserved-but-unallocated above this share of the GPU points at fragmentation
# A rung that moves the predicted peak by less than the 0.1 GiB the ladder prints changes nothing.
MIN_EFFECT_BYTES = 0.05 * GIB
Verdict = Literal["fits", "over", "too little", "no effect", "illegal"]


@dataclass(frozen=True, slots=True)
class Target:
    """What a rung must reach, from the config that ran out of memory and its log."""

    baseline_peak_bytes: float  # the failing config's predicted reserved peak (worst stage)
    capacity_bytes: float
    margin: float
    log_shortfall_bytes: float = 0.0  # the failed allocation's request minus the free memory

    @property
    def limit_bytes(self) -> float:
        return (1.0 - self.margin) * self.capacity_bytes


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung judged against the failing config; offered only when ``verdict`` is "fits", and
    ``reason`` is one sentence saying why it fits or which test rejected it."""

    outcome: remedies.Outcome
    verdict: Verdict
    reason: str
    peak_change_bytes: float  # the rung's predicted peak minus the failing config's

    @property
    def offered(self) -> bool:
        return self.verdict == "fits"

    def as_dict(self) -> dict[str, object]:
        return self.outcome.as_dict() | {
            "verdict": self.verdict,
            "offered": self.offered,
            "reason": self.reason,
            "peak_change_bytes": self.peak_change_bytes,
        }


@dataclass(frozen=True, slots=True)
class OomDiagnosis:
    predicted_peak_reserved_bytes: float
    capacity_bytes: float
    predicted_fits: bool
    over_stages: list[dict[str, object]]
    evidence: list[str]
    ladder: list[Rung]  # every rung tried, least intrusive first, offered or rejected
    recommended: remedies.Outcome | None
    fastest: remedies.Outcome | None
    min_gpus_needed: int | None
    needed_drop_bytes: float  # how far the predicted peak must fall: to the margin, and by the log's shortfall

    def as_dict(self) -> dict[str, object]:
        return {
            "predicted_peak_reserved_bytes": self.predicted_peak_reserved_bytes,
            "capacity_bytes": self.capacity_bytes,
            "predicted_fits": self.predicted_fits,
            "over_stages": self.over_stages,
            "evidence": self.evidence,
            "ladder": [rung.as_dict() for rung in self.ladder],
            "recommended": self.recommended.as_dict() if self.recommended else None,
            "fastest": self.fastest.as_dict() if self.fastest else None,
            "min_gpus_needed": self.min_gpus_needed,
            "needed_drop_bytes": self.needed_drop_bytes,
        }

    @property
    def offered(self) -> list[Rung]:
        return [rung for rung in self.ladder if rung.offered]

    @property
    def rejected(self) -> list[Rung]:
        return [rung for rung in self.ladder if not rung.offered]


def judge(outcome: remedies.Outcome, target: Target) -> Rung:
    """Whether a rung moves the prediction where it must go: legal; predicted peak lower than the
    failing config's by more than MIN_EFFECT_BYTES (a rung predicting the same peak, such as a
    recompute module the failing config's stage peak does not depend on, is no remedy); within
    (1 − margin) of capacity and the host's DRAM (Outcome.fits); and lower by at least the log's
    shortfall, the least the real peak must fall (an OOM message's request minus free memory)."""
    peak, change = outcome.peak_reserved_bytes, outcome.peak_reserved_bytes - target.baseline_peak_bytes

    def rung(verdict: Verdict, reason: str) -> Rung:
        return Rung(outcome, verdict, reason, change)

    if not outcome.legal:
        return rung("illegal", f"illegal: breaks {outcome.problem_rule}: {outcome.problem}")
    if change > MIN_EFFECT_BYTES:
        return rung("no effect", f"raises the predicted peak by {change / GIB:.1f} GiB")
    if change > -MIN_EFFECT_BYTES:
        same = f"no effect: predicts {peak / GIB:.1f} GiB, the same as the config that ran out of memory"
        return rung("no effect", same)
    if peak > target.capacity_bytes:
        return rung("over", f"still over capacity by {(peak - target.capacity_bytes) / GIB:.1f} GiB")
    if peak > target.limit_bytes:
        inside = (
            f"inside capacity with {(target.capacity_bytes - peak) / GIB:.1f} GiB free, but "
            f"{(peak - target.limit_bytes) / GIB:.1f} GiB over the {100 * target.margin:.0f}% safety margin"
        )
        return rung("over", inside)
    if not outcome.fits:
        return rung("over", "fits the GPU but not host memory (the offloaded optimizer needs more CPU DRAM)")
    if -change < target.log_shortfall_bytes:
        short = (
            f"lowers the predicted peak by {-change / GIB:.1f} GiB, less than the "
            f"{target.log_shortfall_bytes / GIB:.1f} GiB the failed allocation lacked"
        )
        return rung("too little", short)
    return rung("fits", f"fits with {(target.capacity_bytes - peak) / GIB:.1f} GiB free")


def log_shortfall_bytes(summary: LogSummary | None) -> float:
    """The most any logged OOM lacked: bytes requested minus bytes free (0 without a log)."""
    if summary is None:
        return 0.0
    return max((max(0.0, e.tried_bytes - e.free_bytes) for e in summary.ooms), default=0.0)


def oom_sentences(summary: LogSummary) -> list[str]:
    """What the log's OOM messages say, one sentence each (first three)."""
    notes = []
    for event in summary.ooms[:3]:
        where = f"rank {event.rank} " if event.rank is not None else ""
        notes.append(
            f"{where}GPU {event.gpu_index} asked for {event.tried_bytes / GIB:.2f} GiB with "
            f"{event.free_bytes / GIB:.2f} GiB free of {event.capacity_bytes / GIB:.1f} GiB "
            f"(log line {event.line_number})"
        )
    return notes


def _log_evidence(run: RunConfig, summary: LogSummary | None) -> tuple[list[str], bool]:
    """Sentences from the log, and whether it shows allocator fragmentation."""
    if summary is None:
        return [], False
    notes = oom_sentences(summary)
    fragmented = False
    capacity = run.hardware.hbm_bytes
    if summary.ooms:
        event = max(summary.ooms, key=lambda e: e.reserved_unallocated_bytes or 0.0)
        slack = event.reserved_unallocated_bytes or 0.0
        if slack > FRAGMENTATION_EVIDENCE * event.capacity_bytes:
            fragmented = True
            notes.append(
                f"{slack / GIB:.1f} GiB was reserved by PyTorch but unallocated: allocator fragmentation, "
                "which expandable segments recover"
            )
        if abs(event.capacity_bytes - capacity) > 0.05 * capacity:
            notes.append(
                f"the log's GPU has {event.capacity_bytes / GIB:.1f} GiB but {run.hardware.name} has "
                f"{capacity / GIB:.1f} GiB: pass the right --gpu"
            )
    peak = summary.peak_memory()
    if peak is not None and peak.max_allocated is not None:
        notes.append(
            f"last memory report before the failure: rank {peak.rank} peaked at "
            f"{peak.max_allocated / GIB:.1f} GiB allocated after {peak.iteration} iterations"
        )
    return notes, fragmented


def _over_stages(memory: MemoryEstimate, margin: float) -> list[dict[str, object]]:
    """Every stage above (1 − margin) of capacity with its four largest components. A stage inside
    capacity but over the margin has ``over_bytes`` ≤ 0: it is shown by its ``free_bytes``."""
    capacity = memory.capacity_bytes
    over = []
    for stage in memory.stages:
        if stage.peak_reserved > (1 - margin) * capacity:
            largest = sorted(stage.components().items(), key=lambda kv: -kv[1])[:4]
            over.append(
                {
                    "stage": stage.stage,
                    "peak_reserved_bytes": stage.peak_reserved,
                    "over_bytes": stage.peak_reserved - capacity,
                    "free_bytes": max(0.0, capacity - stage.peak_reserved),
                    "largest_components": {name: value for name, value in largest},
                }
            )
    return over


def diagnose_oom(
    run: RunConfig,
    summary: LogSummary | None = None,
    *,
    margin: float = 0.05,
    coefficients: TimeCoefficients | None = None,
    megatron_core_version: str = "0.19.2",
    search_more_gpus: bool = True,
) -> OomDiagnosis:
    evidence, fragmented = _log_evidence(run, summary)
    if fragmented and run.options.expandable_segments:
        run = remedies.with_options(run, expandable_segments=False)
    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    capacity = memory.capacity_bytes
    if memory.fits():
        evidence.append(
            f"the estimator predicts {memory.peak_reserved_bytes / GIB:.1f} of {capacity / GIB:.1f} GiB, so the "
            "failure is outside the modelled steady state: routing imbalance without forced balance, a larger "
            "batch or sequence than the config says, another process on the GPU, or a checkpoint/evaluation step"
        )
    target = Target(memory.peak_reserved_bytes, capacity, margin, log_shortfall_bytes(summary))
    baseline = estimate_time(run, coefficients).tokens_per_sec_per_gpu
    ladder = [
        judge(o, target)
        for r in _ladder(run, margin)
        if (
            o := remedies.evaluate(
                r, baseline, margin=margin, coefficients=coefficients, megatron_core_version=megatron_core_version
            )
        )
    ]
    offered = [rung.outcome for rung in ladder if rung.offered]
    min_gpus = None
    if not offered and search_more_gpus and not memory.fits(margin):
        request = PlanRequest(run.model, run.hardware, run.num_gpus, run.options.seq_len, memory_margin=margin)
        min_gpus = min_gpus_that_fit(request)
    return OomDiagnosis(
        predicted_peak_reserved_bytes=memory.peak_reserved_bytes,
        capacity_bytes=capacity,
        predicted_fits=memory.fits(),
        over_stages=_over_stages(memory, margin),
        evidence=evidence,
        ladder=ladder,
        recommended=offered[0] if offered else None,
        fastest=max(offered, key=lambda o: o.tokens_per_sec_per_gpu) if offered else None,
        min_gpus_needed=min_gpus,
        needed_drop_bytes=max(target.baseline_peak_bytes - target.limit_bytes, target.log_shortfall_bytes, 0.0),
    )


def _ladder(run: RunConfig, margin: float) -> list[remedies.Remedy]:
    rungs = [remedies.expandable_segments(run)]
    rungs += [remedies.recompute(run, g, m) for g, m in recompute_ladder(run.model)[1:]]
    rungs.append(remedies.low_precision(run))
    rungs.append(_offload_rung(run, margin))
    rungs += [remedies.relayout(run, axis) for axis in ("cp", "pp", "ep", "tp")]
    return rungs


def _offload_rung(run: RunConfig, margin: float) -> remedies.Remedy:
    """The smallest optimizer offload that fits alone, else with the narrowest selective set that
    then fits, else full offload (shown as not fitting)."""

    def fits(candidate: RunConfig) -> bool:
        return estimate_memory(candidate.model, candidate.hardware, candidate.layout, candidate.options).fits(margin)

    offload = remedies.cheapest_offload(run, fits)
    if offload is not None:
        return offload
    for granularity, modules in recompute_ladder(run.model)[1:-1]:
        base = remedies.recompute(run, granularity, modules).run
        combined = remedies.cheapest_offload(base, fits) if base is not None else None
        if combined is not None:
            return replace(combined, label=f"{combined.label} + selective recompute {','.join(sorted(modules))}")
    return remedies.optimizer_offload(run, 1.0)
