"""Search every legal layout, prune by memory, rank by predicted tokens/s/GPU — by default by the
lower edge of its time band (``estimate.band``: how wrong the model has been on the nearest
measured runs, plus a penalty for extrapolating from them), so an extrapolated layout leads only
if it leads even when the model is as wrong as it has been (``PlanRequest.rank``).

Stages (one way): enumerate parallel layouts (TP, CP, EP, ETP, PP, VPP, MBS, GBS) → legality
(rules.legality) → a model-state lower bound (cheap) → for each surviving layout and precision,
the recompute ladder (none → narrow selective sets → full) × optimizer offload fractions
{0, .25, .5, .75, 1} until memory fits, since memory falls and time rises along both → then
dispatcher, CUDA-graph scope and EP-overlap variants of the fitting option set → rank.

Without a requested GBS every candidate runs one GBS (``common_global_batch``), so ranks
compare equal work. The result keeps the Pareto front (memory vs throughput), a diverse top-k
(one plan per parallel layout) and a conservative fallback with more headroom.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from lcmoe.config_io.bridge import keeps_bf16_grad_buffer, recipe_name
from lcmoe.errors import LcmoeError
from lcmoe.estimate.band import RunDescriptor, TimeBand, TimeEvidence, describe_run, time_band
from lcmoe.estimate.memory import MemoryEstimate, StagedLayout, estimate_memory, stage_state_bytes, staged_layout
from lcmoe.estimate.time import TimeCoefficients, TimeEstimate, estimate_time, shipped_time_coefficients
from lcmoe.layout import (
    ParallelLayout,
    auto_pipeline_layout,
    needs_explicit_layout,
)
from lcmoe.rules.advice import Advice, advise, suggested_cp
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig, default_global_batch
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import LORA_TARGETS, Peft, RecomputeGranularity, TrainingOptions

OFFLOAD_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
RankMode = Literal["conservative", "expected"]
RANK_MODES: tuple[RankMode, ...] = ("conservative", "expected")
# The floor on tokens per step of the common GBS (``common_global_batch``): 4 Mi tokens, Llama 3's
# initial pre-training batch ("an initial batch size of 4M tokens", arXiv:2407.21783 §3.4.1);
# DeepSeek-V3's 128K extension stage ran 480 × 128K ≈ 63M (arXiv:2412.19437 §4.3).
MIN_TOKENS_PER_STEP = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PlanRequest:
    model: ModelSpec
    hardware: HardwareSpec
    num_gpus: int
    seq_len: int
    gbs: int | None = None
    precisions: tuple[str, ...] | None = None
    dispatchers: tuple[str, ...] | None = None
    memory_margin: float = 0.05
    top_k: int = 5
    megatron_core_version: str = "0.19.2"
    allow_offload: bool = True
    allow_cuda_graphs: bool = True
    time_coefficients: TimeCoefficients | None = None  # a user calibration; None = shipped
    # The measured runs behind the time bands (data/time_evidence.yaml, loaded by the CLI); None:
    # no bands, plans rank by the predicted tokens/s.
    time_evidence: TimeEvidence | None = None
    # conservative: rank by the band's lower edge of tokens/s/GPU; expected: by the prediction.
    rank: RankMode = "conservative"
    # Parameter-efficient finetuning: TrainingOptions' peft / lora_* fields, as run_options.peft_options gives them.
    peft: Peft = "none"
    lora_rank: int = 32
    lora_targets: frozenset[str] = LORA_TARGETS
    lora_input_regather: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    run: RunConfig
    memory: MemoryEstimate
    time: TimeEstimate
    reasons: tuple[Advice, ...] = ()
    band: TimeBand | None = None  # the time prediction's uncertainty (estimate.band)

    @property
    def tokens_per_sec_per_gpu(self) -> float:
        return self.time.tokens_per_sec_per_gpu

    @property
    def tokens_per_sec_per_gpu_low(self) -> float:
        """The band's lower edge of tokens/s/GPU (the prediction itself without a band)."""
        if self.band is None:
            return self.tokens_per_sec_per_gpu
        return self.tokens_per_sec_per_gpu * max(0.0, 1 - self.band.pct / 100)

    def rank_value(self, mode: RankMode) -> float:
        """What plans are ranked by: the lower edge (conservative) or the prediction (expected)."""
        return self.tokens_per_sec_per_gpu_low if mode == "conservative" else self.tokens_per_sec_per_gpu

    def time_dict(self) -> dict[str, object]:
        """The time estimate's JSON plus its band: ``band_pct`` (± percent of tokens/s/GPU),
        ``tokens_per_sec_per_gpu_low`` / ``_high`` and ``evidence`` (the nearest measured run and
        the distance to it); null band and evidence when the request carried no evidence."""
        out = self.time.as_dict()
        band = self.band
        out["band_pct"] = band.pct if band else None
        out["tokens_per_sec_per_gpu_low"] = self.tokens_per_sec_per_gpu_low if band else None
        out["tokens_per_sec_per_gpu_high"] = self.tokens_per_sec_per_gpu * (1 + band.pct / 100) if band else None
        out["evidence"] = band.as_dict() if band else None
        return out

    def as_dict(self) -> dict[str, object]:
        lay, opt = self.run.layout, self.run.options
        return {
            "layout": {
                "tp": lay.tp,
                "cp": lay.cp,
                "ep": lay.ep,
                "etp": lay.etp,
                "pp": lay.pp,
                "vpp": lay.vpp,
                "dp": lay.dp,
                "edp": lay.edp,
                "mbs": lay.mbs,
                "gbs": lay.gbs,
                "ga": lay.num_microbatches,
                "cp_comm_type": lay.cp_comm_type,
                "sequence_parallel": lay.sequence_parallel,
                "pipeline_layout": lay.pipeline_layout,
            },
            "recompute": {
                "granularity": opt.recompute_granularity,
                "modules": sorted(opt.recompute_modules),
                "method": opt.recompute_method if opt.recompute_granularity == "full" else None,
                "num_layers": opt.recompute_num_layers if opt.recompute_granularity == "full" else None,
            },
            "precision": opt.precision,
            "dispatcher": opt.dispatcher,
            "cuda_graph_scope": sorted(opt.cuda_graph_scope),
            "overlap_moe_expert_parallel_comm": opt.overlap_moe_expert_parallel_comm,
            "optimizer_offload_fraction": opt.optimizer_offload_fraction,
            "precision_aware_optimizer": opt.precision_aware_optimizer,
            "main_grads_dtype": opt.main_grads_dtype,
            "peft": opt.peft_summary(),
            "memory": self.memory.as_dict(),
            "time": self.time_dict(),
            "reasons": [{"rule": a.rule, "text": a.text} for a in self.reasons],
        }


@dataclass(slots=True)
class SearchResult:
    plans: list[Plan]
    fallback: Plan | None
    pareto: list[Plan]
    searched: int
    legal: int
    fit: int
    closest: Plan | None = None
    min_gpus_needed: int | None = None
    notes: list[str] = field(default_factory=list)
    # (peak reserved bytes, tokens/s/GPU) of every fitting candidate: the report's Pareto scatter.
    fitting_points: list[tuple[float, float]] = field(default_factory=list)
    # The GBS every candidate runs (None: the user's --gbs, rounded per candidate) and why.
    gbs: int | None = None
    gbs_reason: str = ""
    rank: RankMode = "conservative"


# ----- enumeration ---------------------------------------------------------------------------
def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(limit, 1))) + 1)]


def tp_candidates(model: ModelSpec, hardware: HardwareSpec) -> list[int]:
    """TP inside one node (NVLink domain capped at 8 per the guidance) dividing heads and groups."""
    limit = min(8, hardware.nvlink_domain_size)
    out = []
    for tp in _powers_of_two(limit):
        if model.num_attention_heads % tp:
            continue
        g = model.query_groups
        if not model.multi_latent_attention and g % tp and tp % g:
            continue
        out.append(tp)
    return out


def cp_candidates(seq_len: int) -> list[int]:
    """Powers of two with seq % (2·CP) == 0, at least 1K tokens per CP rank, and no more than 8×
    below the guidance's starting guess seq/4096 (LC-CP-START): smaller CP leaves each rank with
    8× the activations of the guess, which the memory prune removes anyway."""
    floor = max(1, suggested_cp(seq_len) // 8)
    return [
        cp for cp in _powers_of_two(max(seq_len // 1024, 1)) if cp >= floor and (cp == 1 or seq_len % (2 * cp) == 0)
    ]


def ep_candidates(model: ModelSpec) -> list[int]:
    experts = model.num_moe_experts or 1
    return [ep for ep in _powers_of_two(experts) if experts % ep == 0] or [1]


def pp_candidates(model: ModelSpec) -> list[int]:
    return [pp for pp in _powers_of_two(min(model.num_layers, 32))]


def vpp_candidates(model: ModelSpec, pp: int) -> list[int]:
    if pp == 1:
        return [1]
    return [v for v in (1, 2, 4, 8) if model.num_layers // (pp * v) >= 2]


@dataclass(frozen=True, slots=True)
class _Shape:
    """A candidate layout before its GBS is set."""

    tp: int
    cp: int
    pp: int
    vpp: int
    dp: int
    ep: int
    mbs: int
    pipeline_layout: str | None

    @property
    def gbs_unit(self) -> int:
        """The GBS must be a multiple of this: MBS·DP, times PP with VPP (rules L-GBS, L-VPP)."""
        return self.mbs * self.dp * (self.pp if self.vpp > 1 else 1)


def _shapes(request: PlanRequest) -> Iterator[_Shape]:
    model, hw, gpus, seq = request.model, request.hardware, request.num_gpus, request.seq_len
    for tp in tp_candidates(model, hw):
        for cp in cp_candidates(seq):
            for pp in pp_candidates(model):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                for vpp in vpp_candidates(model, pp):
                    layout_text = None
                    if pp * vpp > 1 and needs_explicit_layout(model, pp, vpp):
                        layout_text = auto_pipeline_layout(model, pp, vpp)
                        if layout_text is None:
                            continue
                    for ep in ep_candidates(model):
                        if gpus % (ep * pp):
                            continue
                        for mbs in (1, 2) if seq <= 8192 else (1,):
                            yield _Shape(tp, cp, pp, vpp, dp, ep, mbs, layout_text)


def common_global_batch(units: list[int], seq_len: int) -> int:
    """One GBS for every candidate of a request, so that their ranks compare equal work: the
    smallest common multiple of the candidates' GBS units (each can run it exactly), doubled until
    a step holds at least MIN_TOKENS_PER_STEP tokens (a realistic batch, and enough microbatches
    that no pipeline is ranked on a bubble a real run would not have)."""
    gbs = 1
    for unit in units:
        gbs = gbs * unit // math.gcd(gbs, unit)
    base = gbs
    while gbs * seq_len < MIN_TOKENS_PER_STEP:
        gbs += base
    return gbs


def gbs_reason(gbs: int, seq_len: int, requested: int | None) -> str:
    """The sentence the plan prints about its GBS."""
    if requested:
        return (
            f"GBS {requested} as requested, rounded per layout to a multiple of MBS·DP (·PP with VPP) where it is "
            "not one (LC-GBS-SHRINK)"
        )
    return (
        f"GBS {gbs} for every plan ({gbs * seq_len / 2**20:.1f}Mi tokens per step), so ranks compare equal work: "
        f"the smallest GBS every candidate layout can run (a multiple of MBS·DP, ·PP with VPP) with at least "
        f"{MIN_TOKENS_PER_STEP // 2**20}Mi tokens per step (Llama 3's pre-training batch); --gbs sets another"
    )


def enumerate_layouts(request: PlanRequest, gbs: int | None = None) -> Iterator[ParallelLayout]:
    """Every candidate layout; at ``gbs`` when given, else at the request's (``--gbs`` rounded per
    layout) or, without one, at the request's common GBS."""
    shapes = list(_shapes(request))
    if gbs is None and request.gbs is None:
        gbs = common_global_batch([s.gbs_unit for s in shapes], request.seq_len)
    for s in shapes:
        yield ParallelLayout(
            tp=s.tp,
            cp=s.cp,
            ep=s.ep,
            etp=1,
            pp=s.pp,
            vpp=s.vpp,
            dp=s.dp,
            mbs=s.mbs,
            gbs=gbs or default_global_batch(s.dp, s.mbs, s.pp, s.vpp, request.gbs),
            sequence_parallel=s.tp > 1,
            pipeline_layout=s.pipeline_layout,
            cp_comm_type="all_gather" if request.model.is_dsa and s.cp > 1 else "p2p",
        )


def recompute_ladder(model: ModelSpec) -> list[tuple[RecomputeGranularity, frozenset[str]]]:
    """None, then the guidance's selective sets narrowest first (LC-RECOMPUTE-SELECTIVE), then full."""
    ladder: list[tuple[RecomputeGranularity, frozenset[str]]] = [("none", frozenset())]
    sets: list[set[str]] = []
    if model.is_moe:
        sets.append({"moe_act"})
        sets.append({"moe_act", "layernorm"})
    if model.multi_latent_attention:
        sets.append({"mla_up_proj", "layernorm"} | ({"moe_act"} if model.is_moe else set()))
    # layernorm recompute reaches only standalone norms (MoE pre-MLP, MLA input); a dense GQA
    # model's norms are fused into the next GEMM (estimate.memory.norm_bytes).
    standalone_norms = model.is_moe or model.multi_latent_attention
    widest = {"mlp"} | ({"layernorm"} if standalone_norms else set())
    widest |= {"mla_up_proj"} if model.multi_latent_attention else set()
    if model.is_moe:
        sets.append(widest | {"moe_act"})
        sets.append(widest | {"moe"})
    else:
        sets.append(widest)
    seen: list[frozenset[str]] = []
    for s in sets:
        f = frozenset(s)
        if f not in seen:
            seen.append(f)
            ladder.append(("selective", f))
    ladder.append(("full", frozenset()))
    return ladder


def precisions_for(request: PlanRequest) -> tuple[str, ...]:
    if request.precisions:
        return request.precisions
    if request.hardware.supports("mxfp8"):
        return ("bf16", "mxfp8")
    if request.hardware.supports("fp8"):
        return ("bf16", "fp8-blockwise")
    return ("bf16",)


def dispatchers_for(request: PlanRequest) -> tuple[str, ...]:
    if request.dispatchers:
        return request.dispatchers
    if not request.model.is_moe:
        return ("alltoall",)
    if request.hardware.nvlink_domain_size > 8:
        return ("alltoall", "hybridep")
    return ("alltoall", "deepep", "hybridep")


def base_options(request: PlanRequest, precision: str) -> TrainingOptions:
    """Bridge perf-recipe defaults: distributed + precision-aware optimizer (BF16 moments),
    expandable segments, alltoall dispatcher, and a BF16 gradient buffer where the model's Bridge
    recipe can keep one under lcmoe's overrides (``keeps_bf16_grad_buffer``: a recipe that names
    its mixed precision reduces gradients in FP32, so the plan counts what will run)."""
    options = TrainingOptions(
        seq_len=request.seq_len,
        precision=precision,
        main_grads_dtype="bf16",
        exp_avg_dtype="bf16",
        dispatcher="alltoall",
        peft=request.peft,
        lora_rank=request.lora_rank,
        lora_targets=request.lora_targets,
        lora_input_regather=request.lora_input_regather,
    )
    if precision != "fp16" and not keeps_bf16_grad_buffer(recipe_name(request.model, options, request.hardware)):
        options = replace(options, main_grads_dtype="fp32")
    return options


def _fits(memory: MemoryEstimate, margin: float) -> bool:
    return memory.fits(margin)


def static_lower_bound_fits(run: RunConfig, margin: float, staged: StagedLayout | None = None) -> bool:
    """Cheap prune: weights + grads + the GPU share of the optimizer with everything offloaded
    must already fit, or no recompute or offload can save the layout."""
    capacity = (1 - margin) * run.hardware.hbm_bytes
    offloaded = replace(run.options, optimizer_offload_fraction=1.0)
    staged = staged or staged_layout(run.model, run.layout)
    for stage, params in zip(staged.stages, staged.params, strict=True):
        _, state = stage_state_bytes(run.model, run.layout, stage, offloaded, run.hardware.architecture, params)
        if state.weights + state.weight_copies + state.gradients > capacity:
            return False
    return True


def _variants(request: PlanRequest, run: RunConfig) -> Iterator[RunConfig]:
    """Dispatcher × CUDA graphs × EP overlap × CP exchange (p2p ring, or a2a when the heads per
    TP rank divide by CP — LC-CP-COMM) around a fitting option set."""
    graph_choices: list[frozenset[str]] = [frozenset()]
    if request.allow_cuda_graphs and run.options.recompute_granularity != "full":
        scope = {"attn", "moe_router", "moe_preprocess"} if run.model.is_moe else {"attn"}
        if run.options.recomputes("moe"):
            scope -= {"moe_router", "moe_preprocess"}
        graph_choices.append(frozenset(scope))
    cp_types = ["p2p"]
    if run.model.is_dsa and run.layout.cp > 1:
        cp_types = ["all_gather"]  # the only CP DSA attention runs (L-DSA-CP)
    elif run.layout.cp > 1 and (run.model.num_attention_heads // run.layout.tp) % run.layout.cp == 0:
        cp_types.append("a2a")
    for cp_comm_type in cp_types:
        layout = replace(run.layout, cp_comm_type=cp_comm_type)
        for dispatcher in dispatchers_for(request):
            for graphs in graph_choices:
                for overlap in (False, True) if run.model.is_moe and run.layout.ep > 1 else (False,):
                    options = replace(
                        run.options,
                        dispatcher=dispatcher,
                        cuda_graph_scope=graphs,
                        overlap_moe_expert_parallel_comm=overlap,
                    )
                    yield replace(run, layout=layout, options=options)


def search(request: PlanRequest, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """The full search; see the module docstring."""
    if request.num_gpus < 1:
        raise LcmoeError("--gpus", request.num_gpus, "must be at least 1", "e.g. --gpus 64")
    # Resolved once instead of once per timed candidate.
    coefficients = request.time_coefficients or shipped_time_coefficients(request.hardware.architecture)
    request = replace(request, time_coefficients=coefficients)
    shapes = list(_shapes(request))
    gbs = None if request.gbs else common_global_batch([s.gbs_unit for s in shapes], request.seq_len)
    layouts = list(enumerate_layouts(request, gbs))
    searched = legal = 0
    evaluated: list[Plan] = []
    over: list[Plan] = []
    for index, layout in enumerate(layouts):
        if progress:
            progress(index, len(layouts))
        staged: StagedLayout | None = None  # the same for every precision; built once legal
        for precision in precisions_for(request):
            options = base_options(request, precision)
            run = RunConfig(request.model, request.hardware, layout, options)
            searched += 1
            if violations(run, megatron_core_version=request.megatron_core_version):
                continue
            legal += 1
            staged = staged or staged_layout(run.model, run.layout)
            if not static_lower_bound_fits(run, request.memory_margin, staged):
                continue
            fitted = _first_fitting(request, run, staged)
            if fitted is None:
                if len(over) < 64:  # enough to name the closest plan when nothing fits
                    memory = estimate_memory(run.model, run.hardware, run.layout, run.options, staged=staged)
                    over.append(Plan(run, memory, estimate_time(run, request.time_coefficients, staged=staged)))
                continue
            best_variant = _fastest_fitting_variant(request, fitted, staged)
            if best_variant is not None:
                evaluated.append(best_variant)
    if progress:
        progress(len(layouts), len(layouts))
    banded = _Bands(request.time_evidence)
    evaluated = [banded(p) for p in evaluated]
    evaluated.sort(key=lambda p: -p.rank_value(request.rank))
    top = _diverse_top(evaluated, request.top_k)
    result = SearchResult(
        plans=[_explained(p, evaluated) for p in top],
        fallback=None,
        pareto=pareto_front(evaluated),
        searched=searched,
        legal=legal,
        fit=len(evaluated),
        fitting_points=[(p.memory.peak_reserved_bytes, p.tokens_per_sec_per_gpu) for p in evaluated],
        gbs=gbs,
        gbs_reason=gbs_reason(gbs or 0, request.seq_len, request.gbs),
        rank=request.rank,
    )
    if evaluated:
        result.fallback = _explained(conservative_fallback(evaluated, request), evaluated)
    else:
        closest = min(over, key=lambda p: p.memory.peak_reserved_bytes - p.memory.capacity_bytes, default=None)
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
        return replace(plan, band=band)


def _fastest_fitting_variant(request: PlanRequest, fitted: RunConfig, staged: StagedLayout) -> Plan | None:
    """The fastest legal variant of ``fitted`` that still fits. Time does not depend on memory, so
    the variants are timed first and memory is estimated fastest-first until one fits (most
    variants fit, so this is usually one memory estimate instead of one per variant)."""
    timed: list[tuple[RunConfig, TimeEstimate]] = []
    for variant in _variants(request, fitted):
        if violations(variant, megatron_core_version=request.megatron_core_version):
            continue
        timed.append((variant, estimate_time(variant, request.time_coefficients, staged=staged)))
    # Stable sort: among equal predictions the first enumerated variant wins, as before.
    timed.sort(key=lambda pair: -pair[1].tokens_per_sec_per_gpu)
    for variant, time in timed:
        memory = estimate_memory(variant.model, variant.hardware, variant.layout, variant.options, staged=staged)
        if _fits(memory, request.memory_margin):
            return Plan(variant, memory, time)
    return None


def _first_fitting(request: PlanRequest, run: RunConfig, staged: StagedLayout) -> RunConfig | None:
    """The cheapest (recompute, offload) pair that fits. Per rung of the recompute ladder the
    needed offload fraction is solved from the optimizer bytes (memory falls linearly with it),
    rounded up to {0, .25, .5, .75, 1} and verified; the first rung that fits without offload
    ends the climb, and among the (at most two) fitting rungs the faster one wins."""
    capacity = (1 - request.memory_margin) * run.hardware.hbm_bytes
    candidates: list[RunConfig] = []
    for granularity, modules in recompute_ladder(run.model):
        options = replace(
            run.options,
            recompute_granularity=granularity,
            recompute_modules=modules,
            optimizer_offload_fraction=0.0,
        )
        trial = replace(run, options=options)
        if violations(trial, megatron_core_version=request.megatron_core_version):
            continue
        memory = estimate_memory(trial.model, trial.hardware, trial.layout, trial.options, staged=staged)
        fraction = 0.0
        if not _fits(memory, request.memory_margin):
            if not request.allow_offload:
                continue
            excess = max(s.peak_reserved - capacity for s in memory.stages)
            optimizer = min(s.optimizer for s in memory.stages if s.peak_reserved > capacity)
            if optimizer <= 0 or excess > optimizer * 1.1:
                continue
            fraction = next((f for f in OFFLOAD_FRACTIONS if f * optimizer * 1.05 >= excess), 1.0)
            trial = replace(trial, options=replace(options, optimizer_offload_fraction=fraction))
            memory = estimate_memory(trial.model, trial.hardware, trial.layout, trial.options, staged=staged)
            if not _fits(memory, request.memory_margin):
                if fraction == 1.0:
                    continue
                trial = replace(trial, options=replace(options, optimizer_offload_fraction=1.0))
                memory = estimate_memory(trial.model, trial.hardware, trial.layout, trial.options, staged=staged)
                if not _fits(memory, request.memory_margin):
                    continue
        candidates.append(trial)
        if fraction == 0.0 or len(candidates) >= 2:
            break
    if not candidates:
        return None
    return max(
        candidates, key=lambda r: estimate_time(r, request.time_coefficients, staged=staged).tokens_per_sec_per_gpu
    )


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
