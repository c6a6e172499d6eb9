"""One candidate of a plan search, from its Bridge-default options to its fastest fitting plan:
a model-state lower bound (cheap, ``static_lower_bound_fits``), the recompute ladder × optimizer
offload fractions until memory fits (``first_fitting``), then the dispatcher / CUDA-graph /
EP-overlap / CP-exchange variants of the fitting option set, timed first and memory-checked
fastest-first (``fastest_fitting_variant``). ``plan.search`` re-exports the public names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from lcmoe.estimate.memory import (
    MemoryEstimate,
    SharedLayerBytes,
    StagedLayout,
    StageMemory,
    estimate_memory,
    memory_of_stages,
    stage_inputs,
    stage_memory,
    stage_state_bytes,
    staged_layout,
)
from lcmoe.estimate.time import (
    RunAmounts,
    SharedPricing,
    TimeCoefficients,
    TimeEstimate,
    combine,
    dispatch_bytes,
    estimate_time,
    exchanged_amounts,
    relaunched_amounts,
    shared_pricing,
    shipped_time_coefficients,
    time_amounts,
)
from lcmoe.layout import ParallelLayout
from lcmoe.plan.candidates import OFFLOAD_FRACTIONS, activation_offload_rung, dispatchers_for, recompute_ladder
from lcmoe.plan.judge import Judge
from lcmoe.plan.plans import Plan, PlanRequest
from lcmoe.rules.context_parallel import sensible_hierarchical_sizes
from lcmoe.run import RunConfig
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions, unchecked_replace

# The search's copies of validated options (recompute rungs, offloads, variants) skip re-validation.
options_with = unchecked_replace


@dataclass(slots=True)
class SearchMemo:
    """What one search remembers between its candidates, so that the work every layout repeats
    is done once; it lives for one ``search`` call, like ``Judge`` (the memo the style allows).

    ``copy`` is ``options_with``, each copy made once: the option sets a search tries (recompute
    rungs, offload fractions, dispatcher / CUDA-graph / EP-overlap variants) are a few dozen
    copies of its starting options, asked for again by every layout (about 36 000 copies for
    DeepSeek-V3 on 512 GPUs, each a slow ``copy.copy`` of a slotted dataclass, a fifth of the
    search). A hit hands out the same object again, which also makes later equality checks an
    identity check. The key holds each value's type, so that 1 and 1.0 (equal, but written
    differently to JSON) stay apart. ``layers``: the per-layer stored activations of the
    memory estimates (``SharedLayerBytes``), for the search's model. ``amounts``: the time
    amounts of a candidate's fitted run (``time_of``), until its variants take them
    (``priced_variants``)."""

    layers: SharedLayerBytes | None = None
    amounts: dict[tuple[ParallelLayout, TrainingOptions], RunAmounts] = field(default_factory=dict)
    copies: dict[tuple[TrainingOptions, tuple[tuple[str, type, object], ...]], TrainingOptions] = field(
        default_factory=dict
    )

    def copy(self, options: TrainingOptions, **changes: object) -> TrainingOptions:
        key = (options, tuple((name, type(value), value) for name, value in changes.items()))
        made = self.copies.get(key)
        if made is None:
            made = self.copies[key] = options_with(options, **changes)
        return made


def search_memo(request: PlanRequest) -> SearchMemo:
    """A fresh memo for one search of ``request``."""
    return SearchMemo(layers=SharedLayerBytes(request.model))


def copier(memo: SearchMemo | None) -> Callable[..., TrainingOptions]:
    """The memo's ``copy``, or a plain ``options_with`` without one."""
    return memo.copy if memo is not None else options_with


def with_options(run: RunConfig, options: TrainingOptions) -> RunConfig:
    """``run`` under other options (RunConfig has nothing to validate)."""
    return RunConfig(run.model, run.hardware, run.layout, options)


def memory_of(request: PlanRequest, run: RunConfig, staged: StagedLayout) -> MemoryEstimate:
    """The memory estimate under the request's coefficients (resolved once by ``search``)."""
    return estimate_memory(run.model, run.hardware, run.layout, run.options, request.memory_coefficients, staged=staged)


def probed_memory(
    request: PlanRequest,
    run: RunConfig,
    staged: StagedLayout,
    probe: int,
    hopeless: Callable[[StageMemory], bool],
    memo: SearchMemo | None = None,
) -> MemoryEstimate | None:
    """``memory_of``, or None when stage ``probe`` alone is ``hopeless`` (over capacity beyond
    what the caller can rescue): a trial that fails usually fails on the stage that was worst
    in the candidate's previous trial, so one stage is estimated instead of all. The stages are
    the same ``stage_memory`` values ``estimate_memory`` computes, in any order (``memo``: the
    search's, whose per-layer bytes it reuses)."""
    layers = memo.layers if memo is not None else None
    inputs = stage_inputs(run.model, run.hardware, run.layout, run.options, request.memory_coefficients, shared=layers)
    first = stage_memory(inputs, staged.stages[probe], staged.params[probe])
    if hopeless(first):
        return None
    stages = tuple(
        first if index == probe else stage_memory(inputs, stage, params)
        for index, (stage, params) in enumerate(zip(staged.stages, staged.params, strict=True))
    )
    return memory_of_stages(stages, run.hardware, inputs.coefficients)


def worst_stage(memory: MemoryEstimate) -> int:
    """Index of the stage with the highest reserved peak (the next trial's probe)."""
    return max(range(len(memory.stages)), key=lambda index: memory.stages[index].peak_reserved)


def over_capacity(request: PlanRequest, run: RunConfig) -> Callable[[StageMemory], bool]:
    """A stage whose reserved peak alone exceeds the usable memory: ``MemoryEstimate.fits`` fails."""
    capacity = (1 - request.memory_margin) * run.hardware.hbm_bytes
    return lambda stage: stage.peak_reserved > capacity


def beyond_offload(request: PlanRequest, run: RunConfig) -> Callable[[StageMemory], bool]:
    """A stage over the usable memory that no offload fraction rescues, so ``_offloaded_fit``
    returns None: over by more than 1.1× its optimizer bytes (the rung's excess is at least this
    stage's, its smallest over-capacity optimizer at most this stage's), or no optimizer on the
    GPU, or offload not allowed."""
    capacity = (1 - request.memory_margin) * run.hardware.hbm_bytes

    def hopeless(stage: StageMemory) -> bool:
        excess = stage.peak_reserved - capacity
        if excess <= 0:
            return False
        return not request.allow_optimizer_offload or stage.optimizer <= 0 or excess > stage.optimizer * 1.1

    return hopeless


def time_of(request: PlanRequest, run: RunConfig, staged: StagedLayout, memo: SearchMemo | None = None) -> TimeEstimate:
    """The time estimate under the request's coefficients (resolved once by ``search``). With
    ``memo`` its amounts are kept for ``priced_variants`` of the same run, which takes them."""
    if memo is None:
        return estimate_time(run, request.time_coefficients, staged=staged)
    amounts = memo.amounts[(run.layout, run.options)] = time_amounts(run, staged)
    return combine(amounts, time_coefficients_of(request, run))


def static_lower_bound_fits(
    run: RunConfig, margin: float, staged: StagedLayout | None = None, memo: SearchMemo | None = None
) -> bool:
    """Cheap prune: weights + grads + the GPU share of the optimizer with everything offloaded
    must already fit, or no recompute or offload can save the layout (``memo``: the search's)."""
    capacity = (1 - margin) * run.hardware.hbm_bytes
    offloaded = copier(memo)(run.options, optimizer_offload_fraction=1.0)
    staged = staged or staged_layout(run.model, run.layout)
    for stage, params in zip(staged.stages, staged.params, strict=True):
        _, state = stage_state_bytes(run.model, run.layout, stage, offloaded, run.hardware.architecture, params)
        if state.weights + state.weight_copies + state.gradients > capacity:
            return False
    return True


def variants(request: PlanRequest, run: RunConfig, memo: SearchMemo | None = None) -> Iterator[RunConfig]:
    """Dispatcher × CUDA graphs × EP overlap × CP exchange (p2p ring, or a2a when the heads per
    TP rank divide by CP, or a2a+p2p where the CP group spans beyond the NVLink domain with its
    a2a group inside it — LC-CP-COMM, ``rules.context_parallel.sensible_hierarchical_sizes``)
    around a fitting option set (``memo``: the search's)."""
    copy = copier(memo)
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
    hierarchical = None if run.model.is_dsa else hierarchical_sizes(run)
    if hierarchical:
        cp_types.append("a2a+p2p")
    overlaps = (False, True) if run.model.is_moe and run.layout.ep > 1 else (False,)
    for cp_comm_type in cp_types:
        layout = (
            run.layout
            if cp_comm_type == run.layout.cp_comm_type
            else replace(
                run.layout,
                cp_comm_type=cp_comm_type,
                hierarchical_context_parallel_sizes=hierarchical if cp_comm_type == "a2a+p2p" else None,
            )
        )
        for dispatcher in dispatchers_for(request):
            for graphs in graph_choices:
                for overlap in overlaps:
                    options = copy(
                        run.options,
                        dispatcher=dispatcher,
                        cuda_graph_scope=graphs,
                        overlap_moe_expert_parallel_comm=overlap,
                    )
                    yield RunConfig(run.model, run.hardware, layout, options)
                    twin = dynamic_cp_twin(run.model, layout, options, copy)
                    if twin is not None:
                        yield RunConfig(run.model, run.hardware, layout, twin)


def dynamic_cp_twin(
    model: ModelSpec, layout: ParallelLayout, options: TrainingOptions, copy: Callable[..., TrainingOptions]
) -> TrainingOptions | None:
    """The dynamic-CP twin of a packed variant with CP > 1 on the p2p ring, without EP overlap or
    CUDA graphs (which it excludes: rules.dynamic_cp), at M = seq_len / CP (the same per-rank tokens,
    so the same memory: ``memory_twin_key`` shares it); None where there is none to try."""
    if not options.is_packed or layout.cp <= 1 or layout.cp_comm_type != "p2p" or layout.pp > 1:
        return None
    if options.overlap_moe_expert_parallel_comm or options.cuda_graph_scope or model.multi_latent_attention:
        return None
    return copy(options, dynamic_context_parallel=True, max_seqlen_per_dp_cp_rank=options.seq_len // layout.cp)


def hierarchical_sizes(run: RunConfig) -> tuple[int, int] | None:
    """The a2a+p2p split the search tries for ``run``'s layout (None: none worth trying)."""
    lay = run.layout
    return sensible_hierarchical_sizes(run.model, lay.tp, lay.cp, run.hardware.nvlink_domain_size)


def time_coefficients_of(request: PlanRequest, run: RunConfig) -> TimeCoefficients:
    """The request's time coefficients (resolved once by ``search``), else the shipped ones, as
    ``estimate_time`` picks them."""
    return request.time_coefficients or shipped_time_coefficients(run.hardware.architecture)


def amounts_key(run: RunConfig) -> tuple[str, tuple[int, ...] | None, float]:
    """What the time amounts of ``run``'s variants depend on besides the fitted run: the CP
    exchange (with an a2a+p2p split) and the dispatch width; ``relaunched_amounts`` re-prices the rest."""
    lay = run.layout
    return (lay.cp_comm_type, lay.hierarchical_context_parallel_sizes, dispatch_bytes(run.options))


def priced_variants(
    request: PlanRequest, fitted: Plan, staged: StagedLayout, judge: Judge, memo: SearchMemo | None = None
) -> list[tuple[RunConfig, TimeEstimate, bool]]:
    """Every legal variant of ``fitted`` with its time estimate and whether it is ``fitted``
    itself (whose estimate is reused). The variants of one CP exchange (and dispatch width)
    differ only in dispatcher, CUDA-graph scope and EP overlap, which leave the FLOPs and bytes
    alone: their amounts are computed once (``time_amounts``) and re-priced per variant
    (``relaunched_amounts`` → ``combine``), a sixth of the amount computations of timing each
    variant from scratch. The amounts ``time_of`` kept for ``fitted`` in ``memo`` seed them;
    the first amounts of each other CP exchange or dispatch width are exchanged from the seed
    (``exchanged_amounts``: the layers counted again, the stage and run totals taken over). The
    variants of one key share what ``combine`` computes alike for them (``SharedPricing``)."""
    coefficients = time_coefficients_of(request, fitted.run)
    amounts: dict[tuple[str, tuple[int, ...] | None, float], RunAmounts] = {}
    kept = memo.amounts.pop((fitted.run.layout, fitted.run.options), None) if memo is not None else None
    if kept is not None:
        amounts[amounts_key(fitted.run)] = kept
    seed = kept  # the first amounts known: the others are exchanged from them
    pricing: dict[tuple[str, tuple[int, ...] | None, float], SharedPricing] = {}
    priced: list[tuple[RunConfig, TimeEstimate, bool]] = []
    for variant in variants(request, fitted.run, memo):
        if not judge.legal(variant):
            continue
        if variant.options == fitted.run.options and variant.layout == fitted.run.layout:
            priced.append((variant, fitted.time, True))
            continue
        if variant.options.dynamic_context_parallel:  # priced per document class: estimate.dynamic_cp
            priced.append((variant, estimate_time(variant, coefficients), False))
            continue
        key = amounts_key(variant)
        known = amounts.get(key)
        if known is not None:
            known = relaunched_amounts(known, variant)
        elif seed is not None:
            known = amounts[key] = exchanged_amounts(seed, variant, staged)
        else:
            known = seed = amounts[key] = time_amounts(variant, staged)
        shared = pricing.get(key) or pricing.setdefault(key, shared_pricing(known))
        priced.append((variant, combine(known, coefficients, shared), False))
    return priced


def memory_twin_key(run: RunConfig) -> tuple[ParallelLayout, str, frozenset[str]]:
    """What the memory estimates of one fitted option set's variants differ in: the layout (CP
    exchange), the dispatcher and the CUDA-graph scope. The memory estimate reads no
    ``overlap_moe_expert_parallel_comm`` (EP overlap changes when tokens travel, not what is
    stored: the estimator never reads that field), so the two overlap twins of a variant have
    equal estimates and one is computed for both."""
    return run.layout, run.options.dispatcher, run.options.cuda_graph_scope


def fastest_fitting_variant(
    request: PlanRequest, fitted: Plan, staged: StagedLayout, judge: Judge, memo: SearchMemo | None = None
) -> Plan | None:
    """The fastest legal variant of ``fitted`` that still fits. Time does not depend on memory, so
    the variants are timed first (``priced_variants``) and memory is estimated fastest-first until
    one fits (most variants fit, so this is usually one memory estimate instead of one per
    variant). The variant that is ``fitted`` itself reuses its estimates, and so does its overlap
    twin (``memory_twin_key``); each other pair of twins is estimated once."""
    timed = priced_variants(request, fitted, staged, judge, memo)
    # Stable sort: among equal predictions the first enumerated variant wins, as before.
    timed.sort(key=lambda entry: -entry[1].tokens_per_sec_per_gpu)
    probe = worst_stage(fitted.memory)
    known: dict[tuple[ParallelLayout, str, frozenset[str]], MemoryEstimate | None] = {
        memory_twin_key(fitted.run): fitted.memory
    }
    for variant, time, _ in timed:
        key = memory_twin_key(variant)
        if key in known:
            memory = known[key]
        else:
            memory = known[key] = probed_memory(request, variant, staged, probe, over_capacity(request, variant), memo)
        if memory is not None and memory.fits(request.memory_margin):
            return Plan(variant, memory, time)
    return None


def _offloaded_fit(
    request: PlanRequest, trial: RunConfig, memory: MemoryEstimate, staged: StagedLayout, memo: SearchMemo | None
) -> tuple[RunConfig, MemoryEstimate] | None:
    """A rung that does not fit without offload: the offload fraction solved from the optimizer
    bytes (memory falls linearly with it), rounded up to OFFLOAD_FRACTIONS and verified, then
    full offload; None when neither fits or offload cannot cover the excess."""
    capacity = (1 - request.memory_margin) * trial.hardware.hbm_bytes
    excess = max(s.peak_reserved - capacity for s in memory.stages)
    optimizer = min(s.optimizer for s in memory.stages if s.peak_reserved > capacity)
    if optimizer <= 0 or excess > optimizer * 1.1:
        return None
    fraction = next((f for f in OFFLOAD_FRACTIONS if f * optimizer * 1.05 >= excess), 1.0)
    fractions = (fraction,) if fraction == 1.0 else (fraction, 1.0)
    probe, over = worst_stage(memory), over_capacity(request, trial)
    for offload in fractions:
        offloaded = with_options(trial, copier(memo)(trial.options, optimizer_offload_fraction=offload))
        found = probed_memory(request, offloaded, staged, probe, over, memo)
        if found is not None and found.fits(request.memory_margin):
            return offloaded, found
    return None


def _activation_offloaded(
    request: PlanRequest,
    run: RunConfig,
    staged: StagedLayout,
    judge: Judge,
    found: list[tuple[RunConfig, MemoryEstimate]],
    memo: SearchMemo | None,
) -> list[tuple[RunConfig, MemoryEstimate]]:
    """The activation-offloading rung (``activation_offload_rung``) as one more candidate of
    ``first_fitting`` where memory is tight: tried only when the climb found nothing that fits at
    or below that rung's recompute without offloading anything, so layouts that fit without it
    keep their plans; [] where it is illegal or does not fit (with optimizer offload if need be)."""
    rung = activation_offload_rung(run.model, run.options.seq_len) if request.allow_offload else None
    if rung is None:
        return []
    granularity, recompute, offload = rung
    ladder = recompute_ladder(run.model)
    depth = ladder.index((granularity, recompute))
    for trial, _ in found:
        opt = trial.options
        rung_depth = ladder.index((opt.recompute_granularity, opt.recompute_modules))
        if opt.optimizer_offload_fraction == 0 and rung_depth <= depth:
            return []
    options = copier(memo)(
        run.options,
        recompute_granularity=granularity,
        recompute_modules=recompute,
        activation_offload_modules=offload,
        optimizer_offload_fraction=0.0,
    )
    trial = with_options(run, options)
    if not judge.legal(trial):
        return []
    memory = probed_memory(request, trial, staged, 0, beyond_offload(request, trial), memo)
    if memory is None:
        return []
    if memory.fits(request.memory_margin):
        return [(trial, memory)]
    offloaded = _offloaded_fit(request, trial, memory, staged, memo)
    return [offloaded] if offloaded is not None else []


def first_fitting(
    request: PlanRequest, run: RunConfig, staged: StagedLayout, judge: Judge, memo: SearchMemo | None = None
) -> Plan | None:
    """The cheapest (recompute, offload) pair that fits. Per rung of the recompute ladder the
    needed offload fraction is solved (``_offloaded_fit``); the first rung that fits without
    offload ends the climb, and among the (at most two) fitting rungs the faster one wins
    (``memo``: the search's)."""
    copy = copier(memo)
    found: list[tuple[RunConfig, MemoryEstimate]] = []
    probe, hopeless = 0, beyond_offload(request, run)  # 1F1B: the first stage holds the most microbatches
    for granularity, modules in recompute_ladder(run.model):
        options = copy(
            run.options,
            recompute_granularity=granularity,
            recompute_modules=modules,
            optimizer_offload_fraction=0.0,
        )
        trial = with_options(run, options)
        if not judge.legal(trial):
            continue
        memory = probed_memory(request, trial, staged, probe, hopeless, memo)
        if memory is None:  # neither fits nor can be offloaded into fitting (``beyond_offload``)
            continue
        probe = worst_stage(memory)
        if memory.fits(request.memory_margin):
            found.append((trial, memory))
            break
        offloaded = _offloaded_fit(request, trial, memory, staged, memo) if request.allow_optimizer_offload else None
        if offloaded is None:
            continue
        found.append(offloaded)
        if len(found) >= 2:
            break
    found += _activation_offloaded(request, run, staged, judge, found, memo)
    # max keeps the first of equal predictions, as the search always has.
    plans = [Plan(trial, memory, time_of(request, trial, staged, memo)) for trial, memory in found]
    return max(plans, key=lambda p: p.tokens_per_sec_per_gpu, default=None)
