"""``estimate --explain``: one stage's terms (amount / rate × factor = seconds) and how they combine
into the step time."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.errors import LcmoeError
from lcmoe.estimate.time.amounts import time_amounts
from lcmoe.estimate.time.coefficients import TimeCoefficients, shipped_time_coefficients
from lcmoe.estimate.time.pipeline import combine
from lcmoe.estimate.time.stage import stage_time
from lcmoe.estimate.time.terms import TimeTerm, stage_terms, step_terms
from lcmoe.run import RunConfig


@dataclass(frozen=True, slots=True)
class TimeExplanation:
    """step = critical_microbatch_seconds × (num_microbatches + bubble_factor) + Σ step_terms."""

    stage: int  # the pipeline rank whose terms are listed
    critical_stage: int  # the slowest rank, which sets the step
    terms: tuple[TimeTerm, ...]
    microbatch_seconds: float  # Σ terms: one microbatch on one GPU of ``stage``
    critical_microbatch_seconds: float
    num_microbatches: int
    bubble_factor: float  # (pp − 1) / vpp: the 1F1B / interleaved bubble in microbatches
    step_terms: tuple[TimeTerm, ...]
    step_seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "critical_stage": self.critical_stage,
            "terms": [t.as_dict() for t in self.terms],
            "microbatch_seconds": self.microbatch_seconds,
            "critical_microbatch_seconds": self.critical_microbatch_seconds,
            "num_microbatches": self.num_microbatches,
            "bubble_factor": self.bubble_factor,
            "step_terms": [t.as_dict() for t in self.step_terms],
            "step_seconds": self.step_seconds,
        }


def explain_time(
    run: RunConfig, coefficients: TimeCoefficients | None = None, stage: int | None = None
) -> TimeExplanation:
    """The terms of pipeline rank ``stage`` (default: the slowest) and the step they make, with the
    shipped (or given) coefficients. A rank the run does not have is an LcmoeError."""
    c = coefficients or shipped_time_coefficients(run.hardware.architecture)
    a = time_amounts(run)
    ranks = [s.rank for s in a.stages]
    estimate = combine(a, c)
    chosen = estimate.critical_stage if stage is None else stage
    if chosen not in ranks:
        raise LcmoeError(
            "--stage", stage, f"no such pipeline stage (this run has {len(ranks)}: 0 to {max(ranks)})", "e.g. --stage 0"
        )
    amounts = a.stages[ranks.index(chosen)]
    explained = stage_time(a, amounts, c)
    critical = stage_time(a, a.stages[ranks.index(estimate.critical_stage)], c)
    return TimeExplanation(
        stage=chosen,
        critical_stage=estimate.critical_stage,
        terms=stage_terms(a, amounts, c, explained.pp_comm),
        microbatch_seconds=explained.total,
        critical_microbatch_seconds=critical.total,
        num_microbatches=a.num_microbatches,
        bubble_factor=(a.pp - 1) / a.vpp if a.pp > 1 else 0.0,
        step_terms=step_terms(a, c),
        step_seconds=estimate.step_seconds,
    )
