"""Single changes to a run, each evaluated by the estimators: the rungs of the OOM ladder and the
knobs of the slow-run report. A remedy never edits the run in place; it returns a new RunConfig
(or None when the change does not apply), and ``evaluate`` runs legality, memory and time on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import estimate_memory
from lcmoe.estimate.time import TimeCoefficients, estimate_time
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig, build_layout, resolve_pipeline_layout
from lcmoe.workload import RecomputeGranularity

OFFLOAD_STEPS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True, slots=True)
class Remedy:
    kind: str  # allocator | recompute | precision | offload | layout | gpus
    label: str
    rule: str | None
    run: RunConfig | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A remedy with its predicted effect, relative to the run it changes."""

    remedy: Remedy
    legal: bool
    problem: str | None  # the first broken rule's message when illegal
    fits: bool
    peak_reserved_bytes: float
    capacity_bytes: float
    tokens_per_sec_per_gpu: float
    throughput_change: float  # (new − old) / old
    problem_rule: str | None = None  # the id of that rule (rules/legality.py)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.remedy.kind,
            "change": self.remedy.label,
            "rule": self.remedy.rule,
            "legal": self.legal,
            "problem": self.problem,
            "problem_rule": self.problem_rule,
            "fits": self.fits,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "capacity_bytes": self.capacity_bytes,
            "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
            "throughput_change": self.throughput_change,
        }


def evaluate(
    remedy: Remedy,
    baseline_tokens_per_sec: float,
    *,
    margin: float = 0.0,
    coefficients: TimeCoefficients | None = None,
    megatron_core_version: str = "0.19.2",
) -> Outcome | None:
    """Legality, memory and time of the changed run; None when the remedy does not apply."""
    run = remedy.run
    if run is None:
        return None
    broken = violations(run, megatron_core_version=megatron_core_version)
    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    speed = estimate_time(run, coefficients).tokens_per_sec_per_gpu
    return Outcome(
        remedy=remedy,
        legal=not broken,
        problem=broken[0].message if broken else None,
        problem_rule=broken[0].rule if broken else None,
        fits=not broken and memory.fits(margin),
        peak_reserved_bytes=memory.peak_reserved_bytes,
        capacity_bytes=memory.capacity_bytes,
        tokens_per_sec_per_gpu=speed,
        throughput_change=speed / baseline_tokens_per_sec - 1 if baseline_tokens_per_sec > 0 else 0.0,
    )


def with_options(run: RunConfig, **changes: object) -> RunConfig:
    return replace(run, options=replace(run.options, **changes))  # type: ignore[arg-type]


def expandable_segments(run: RunConfig) -> Remedy:
    changed = None if run.options.expandable_segments else with_options(run, expandable_segments=True)
    return Remedy("allocator", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", None, changed)


def recompute(run: RunConfig, granularity: RecomputeGranularity, modules: frozenset[str]) -> Remedy:
    label = (
        "full recompute (uniform, 1 layer)"
        if granularity == "full"
        else "selective recompute " + ",".join(sorted(modules))
    )
    rule = "LC-RECOMPUTE-SELECTIVE"
    opt = run.options
    unchanged = opt.recompute_granularity == granularity and opt.recompute_modules == modules
    already_wider = granularity == "selective" and opt.recompute_granularity == "full"
    narrower = (
        granularity == "selective" and opt.recompute_granularity == "selective" and modules <= opt.recompute_modules
    )
    if unchanged or already_wider or narrower:
        return Remedy("recompute", label, rule, None)
    changed = with_options(
        run,
        recompute_granularity=granularity,
        recompute_modules=modules if granularity == "selective" else frozenset(),
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    return Remedy("recompute", label, rule, changed)


def low_precision(run: RunConfig) -> Remedy:
    hw = run.hardware
    target = "mxfp8" if hw.supports("mxfp8") else ("fp8-blockwise" if hw.supports("fp8") else None)
    if target is None or run.options.is_fp8:
        return Remedy("precision", "FP8 training", "LC-PRECISION", None)
    return Remedy("precision", f"precision {target}", "LC-PRECISION", with_options(run, precision=target))


def optimizer_offload(run: RunConfig, fraction: float) -> Remedy:
    label = f"optimizer CPU offload fraction {fraction:g}"
    if fraction <= run.options.optimizer_offload_fraction:
        return Remedy("offload", label, "LC-OFFLOAD-128K", None)
    return Remedy("offload", label, "LC-OFFLOAD-128K", with_options(run, optimizer_offload_fraction=fraction))


def relayout(run: RunConfig, axis: str, factor: float = 2) -> Remedy:
    """TP, CP, PP or EP scaled by ``factor`` (2 doubles, 0.5 halves) at the same GPU count and GBS
    (DP absorbs TP/CP/PP changes; EP folds into DP·CP·TP and leaves DP alone)."""
    lay = run.layout
    sizes = {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "ep": lay.ep}
    new = sizes[axis] * factor
    rules = {"cp": "LC-CP-START", "tp": "LC-TP-FOR-CP", "pp": "LC-DP-BUDGET", "ep": "LC-CP-NOT-EP"}
    label = f"{axis.upper()} {sizes[axis]} → {new:g}"
    if new < 1 or new != int(new):
        return Remedy("layout", label, rules[axis], None)
    sizes[axis] = int(new)
    if axis == "ep" and (not run.model.is_moe or sizes["ep"] > (run.model.num_moe_experts or 1)):
        return Remedy("layout", label, rules[axis], None)
    # a2a+p2p keeps its a2a group when CP changes, while the p2p ring still has ranks; else p2p.
    hierarchical = lay.hierarchical_context_parallel_sizes
    if hierarchical and sizes["cp"] != lay.cp:
        inner = hierarchical[0]
        hierarchical = (inner, sizes["cp"] // inner) if sizes["cp"] % inner == 0 and sizes["cp"] > inner else None
    cp_comm_type = "p2p" if lay.cp_comm_type == "a2a+p2p" and not hierarchical else lay.cp_comm_type
    try:
        layout = build_layout(
            run.model,
            run.num_gpus,
            tp=sizes["tp"],
            cp=sizes["cp"],
            ep=sizes["ep"],
            etp=lay.etp,
            pp=sizes["pp"],
            vpp=lay.vpp if axis != "pp" else 1,
            mbs=lay.mbs,
            gbs=lay.gbs,
            cp_comm_type=cp_comm_type,
            hierarchical_context_parallel_sizes=hierarchical,
            pipeline_layout=lay.pipeline_layout if axis != "pp" else None,
            round_gbs=True,
        )
    except (LcmoeError, ValueError):
        return Remedy("layout", label, rules[axis], None)
    return Remedy("layout", label, rules[axis], replace(run, layout=layout))


def virtual_pipeline(run: RunConfig, factor: int = 2) -> Remedy:
    """VPP scaled by ``factor``: the interleaved schedule's bubble is (PP−1)/VPP microbatches."""
    lay = run.layout
    label = f"VPP {lay.vpp} → {lay.vpp * factor}"
    if lay.pp == 1:
        return Remedy("layout", label, "LC-DP-BUDGET", None)
    try:
        pipeline = resolve_pipeline_layout(run.model, lay.pp, lay.vpp * factor, None)
        layout = replace(lay, vpp=lay.vpp * factor, pipeline_layout=pipeline)
    except (LcmoeError, ValueError):
        return Remedy("layout", label, "LC-DP-BUDGET", None)
    return Remedy("layout", label, "LC-DP-BUDGET", replace(run, layout=layout))


def cheapest_offload(run: RunConfig, fits: Callable[[RunConfig], bool]) -> Remedy | None:
    """The smallest optimizer offload fraction (0.25 steps) with which ``run`` fits, if any."""
    for fraction in OFFLOAD_STEPS:
        remedy = optimizer_offload(run, fraction)
        if remedy.run is not None and fits(remedy.run):
            return remedy
    return None
