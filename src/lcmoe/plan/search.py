"""Search every legal layout, prune by memory, rank by predicted tokens/s/GPU — by default by the
lower edge of its time band (``estimate.band``: how wrong the model has been on the nearest
measured runs, plus a penalty for extrapolating from them), so an extrapolated layout leads only
if it leads even when the model is as wrong as it has been (``PlanRequest.rank``).

Stages (one way): enumerate parallel layouts (TP, CP, EP, ETP, PP, VPP, MBS, GBS;
``plan.candidates``) → legality (rules.legality) → a model-state lower bound (cheap) → for each
surviving layout and precision, the recompute ladder (none → narrow selective sets → full) ×
optimizer offload fractions {0, .25, .5, .75, 1} until memory fits, since memory falls and time
rises along both → then dispatcher, CUDA-graph scope and EP-overlap variants of the fitting
option set (``plan.fitting``) → rank.

Without a requested GBS every candidate runs one GBS (``common_global_batch``), so ranks
compare equal work. The result keeps the Pareto front (memory vs throughput), a diverse top-k
(one plan per parallel layout) and a conservative fallback with more headroom.

The request types live in ``plan.plans``, the enumeration in ``plan.candidates`` and the
per-candidate climb in ``plan.fitting``; every name importers use is re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lcmoe.errors import LcmoeError
from lcmoe.estimate.band import RunDescriptor, TimeBand, TimeEvidence, describe_run, time_band, widened
from lcmoe.estimate.memory import StagedLayout, shipped_coefficients, staged_layout
from lcmoe.estimate.time import shipped_time_coefficients
from lcmoe.layout import ParallelLayout
from lcmoe.plan.candidates import (
    MIN_TOKENS_PER_STEP,
    OFFLOAD_FRACTIONS,
    base_options,
    common_global_batch,
    cp_candidates,
    dispatchers_for,
    enumerate_layouts,
    ep_candidates,
    gbs_reason,
    layout_shapes,
    pp_candidates,
    precisions_for,
    recompute_ladder,
    tp_candidates,
    vpp_candidates,
)
from lcmoe.plan.fitting import (
    SearchMemo,
    fastest_fitting_variant,
    first_fitting,
    memory_of,
    search_memo,
    static_lower_bound_fits,
    time_of,
)
from lcmoe.plan.judge import Judge, judge_for
from lcmoe.plan.plans import RANK_MODES, Plan, PlanRequest, RankMode, SearchResult
from lcmoe.rules.advice import Advice, advise
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions

__all__ = [
    "MIN_TOKENS_PER_STEP",
    "OFFLOAD_FRACTIONS",
    "RANK_MODES",
    "Plan",
    "PlanRequest",
    "RankMode",
    "SearchResult",
    "base_options",
    "common_global_batch",
    "conservative_fallback",
    "cp_candidates",
    "dispatchers_for",
    "enumerate_layouts",
    "ep_candidates",
    "gbs_reason",
    "larger_gpu_counts",
    "min_gpus_that_fit",
    "pareto_front",
    "pp_candidates",
    "precisions_for",
    "recompute_ladder",
    "search",
    "static_lower_bound_fits",
    "tp_candidates",
    "vpp_candidates",
]

# The closest plans kept when nothing fits: enough to name the one nearest to fitting.
MAX_OVER_PLANS = 64


def resolved(request: PlanRequest) -> PlanRequest:
    """The request with its coefficients loaded, once per search instead of once per estimate."""
    return replace(
        request,
        time_coefficients=request.time_coefficients or shipped_time_coefficients(request.hardware.architecture),
        memory_coefficients=request.memory_coefficients or shipped_coefficients(),
    )


@dataclass(slots=True)
class _Tally:
    """What the candidate loop found: counts, the best fitting plan per candidate, and (while
    nothing fits) a few candidates over capacity."""

    searched: int = 0
    legal: int = 0
    evaluated: list[Plan] = field(default_factory=list)
    over: list[Plan] = field(default_factory=list)


def _evaluate(
    request: PlanRequest,
    layout: ParallelLayout,
    starts: tuple[TrainingOptions, ...],
    tally: _Tally,
    judge: Judge,
    memo: SearchMemo,
) -> None:
    """Every precision of one layout (``starts``: ``base_options`` per precision): legality (by
    the search's ``judge``), the model-state bound, the recompute/offload climb and the fastest
    fitting variant (``memo``: what the search remembers between layouts)."""
    staged: StagedLayout | None = None  # the same for every precision; built once legal
    for options in starts:
        run = RunConfig(request.model, request.hardware, layout, options)
        tally.searched += 1
        if not judge.legal(run):
            continue
        tally.legal += 1
        staged = staged or staged_layout(run.model, run.layout)
        if not static_lower_bound_fits(run, request.memory_margin, staged, memo):
            continue
        fitted = first_fitting(request, run, staged, judge, memo)
        if fitted is None:
            if len(tally.over) < MAX_OVER_PLANS:
                tally.over.append(Plan(run, memory_of(request, run, staged), time_of(request, run, staged)))
            continue
        best = fastest_fitting_variant(request, fitted, staged, judge, memo)
        if best is not None:
            tally.evaluated.append(best)


def search(request: PlanRequest, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """The full search; see the module docstring."""
    if request.num_gpus < 1:
        raise LcmoeError("--gpus", request.num_gpus, "must be at least 1", "e.g. --gpus 64")
    request = resolved(request)
    units = [s.gbs_unit for s in layout_shapes(request)]
    gbs = None if request.gbs else common_global_batch(units, request.seq_len)
    layouts = list(enumerate_layouts(request, gbs))
    # The starting options depend on the precision only: built once, not once per layout.
    starts = tuple(base_options(request, precision) for precision in precisions_for(request))
    tally = _Tally()
    judge, memo = judge_for(request.megatron_core_version), search_memo(request)
    for index, layout in enumerate(layouts):
        if progress:
            progress(index, len(layouts))
        _evaluate(request, layout, starts, tally, judge, memo)
    if progress:
        progress(len(layouts), len(layouts))
    return _result(request, tally, gbs)


def _result(request: PlanRequest, tally: _Tally, gbs: int | None) -> SearchResult:
    """Rank the fitting plans (by band when the request has evidence) and assemble the result:
    diverse top-k, Pareto front, fallback, or the closest plan when nothing fits."""
    banded = _Bands(request.time_evidence)
    evaluated = [banded(p) for p in tally.evaluated]
    evaluated.sort(key=lambda p: -p.rank_value(request.rank))
    top = _diverse_top(evaluated, request.top_k)
    result = SearchResult(
        plans=[_explained(p, evaluated) for p in top],
        fallback=None,
        pareto=pareto_front(evaluated),
        searched=tally.searched,
        legal=tally.legal,
        fit=len(evaluated),
        fitting_points=[(p.memory.peak_reserved_bytes, p.tokens_per_sec_per_gpu) for p in evaluated],
        gbs=gbs,
        gbs_reason=gbs_reason(gbs or 0, request.seq_len, request.gbs),
        rank=request.rank,
    )
    if evaluated:
        result.fallback = _explained(conservative_fallback(evaluated, request), evaluated)
    else:
        closest = min(tally.over, key=lambda p: p.memory.peak_reserved_bytes - p.memory.capacity_bytes, default=None)
        result.closest = banded(closest) if closest else None
    return result


class _Bands:
    """Attaches each plan's time band; one band per run descriptor (the layouts of one request
    share a handful), computed on first use. Lives for one search call."""

    def __init__(self, evidence: TimeEvidence | None) -> None:
        self.evidence = evidence
        self.seen: dict[RunDescriptor, TimeBand] = {}

    def __call__(self, plan: Plan) -> Plan:
        if self.evidence is None or not self.evidence.runs:
            return plan
        descriptor = describe_run(plan.run)
        band = self.seen.get(descriptor)
        if band is None:
            band = time_band(descriptor, self.evidence.runs, self.evidence.parameters)
            self.seen[descriptor] = band
        return replace(plan, band=widened(band, plan.time.unmeasured_seconds, plan.time.step_seconds))


def _parallel_key(plan: Plan) -> tuple[int, ...]:
    lay = plan.run.layout
    return (lay.tp, lay.cp, lay.pp, lay.ep)


def _diverse_top(plans: list[Plan], k: int) -> list[Plan]:
    """Best plan per parallel layout (TP, CP, PP, EP), highest throughput first."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for plan in plans:
        key = _parallel_key(plan)
        if key in seen:
            continue
        seen.add(key)
        out.append(plan)
        if len(out) == k:
            break
    return out


def pareto_front(plans: list[Plan]) -> list[Plan]:
    """Plans not beaten on both peak memory (lower) and throughput (higher)."""
    front: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.memory.peak_reserved_bytes, -p.tokens_per_sec_per_gpu)):
        if not front or plan.tokens_per_sec_per_gpu > front[-1].tokens_per_sec_per_gpu:
            front.append(plan)
    return front


def conservative_fallback(plans: list[Plan], request: PlanRequest) -> Plan:
    """The best-ranked plan that leaves ≥ 20% of the GPU free (rollback when the first OOMs or
    misbehaves), else the one with the most headroom."""
    roomy = [p for p in plans if p.memory.peak_reserved_bytes <= 0.8 * p.memory.capacity_bytes]
    if roomy:
        return max(roomy, key=lambda p: p.rank_value(request.rank))
    return min(plans, key=lambda p: p.memory.peak_reserved_bytes)


def _explained(plan: Plan, all_plans: list[Plan]) -> Plan:
    reasons = list(advise(plan.run))
    best = max((p.tokens_per_sec_per_gpu for p in all_plans), default=plan.tokens_per_sec_per_gpu)
    if plan.tokens_per_sec_per_gpu < 0.7 * best:
        reasons.append(
            Advice(
                "LC-FIT-ONLY",
                "warn",
                f"fits but predicts {plan.tokens_per_sec_per_gpu:.0f} tokens/s/GPU, "
                f"{100 * (1 - plan.tokens_per_sec_per_gpu / best):.0f}% below the best legal plan",
            )
        )
    return replace(plan, reasons=tuple(reasons))


def larger_gpu_counts(num_gpus: int, limit_factor: int = 16) -> list[int]:
    """GPU counts above ``num_gpus`` worth trying, smallest first: the request doubled, and the
    next power of two doubled (a count with a large odd factor, such as 250 = 2·5³, leaves TP, CP,
    EP and PP almost nothing to divide, so 256 can fit where 500 would be the next doubling)."""
    power = 1 << num_gpus.bit_length()
    counts = {num_gpus << k for k in range(1, 5)} | {power << k for k in range(5)}
    return sorted(n for n in counts if num_gpus < n <= num_gpus * limit_factor)


def min_gpus_that_fit(request: PlanRequest, limit_factor: int = 16) -> int | None:
    """The smallest GPU count of ``larger_gpu_counts`` for which some plan fits."""
    for gpus in larger_gpu_counts(request.num_gpus, limit_factor):
        if search(replace(request, num_gpus=gpus, top_k=1)).plans:
            return gpus
    return None
