"""Exact pruning for the plan search: a throughput ceiling per candidate (layout, precision) and
the test of whether a candidate under its ceiling can still change the search's output.

The ceiling bounds the tokens/s/GPU of every plan the candidate can become (any recompute rung,
optimizer or activation offload, dispatcher, CUDA-graph scope, EP overlap, CP exchange) from a
floor on its step time (``step_seconds_floor``). ``Frontier`` holds what the fitted plans found
so far guarantee about the output (``plan.search._result``): a candidate whose ceiling is under
the k-th best parallel layout, under the best roomy plan (the fallback) and — at its peak-memory
floor — dominated on the memory/throughput plane (the Pareto front) cannot enter the listed
plans, the fallback or the front, nor raise the best throughput the LC-FIT-ONLY advice compares
with; the search skips its memory climb and variant pricing (``SearchResult.pruned``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from lcmoe.estimate.memory import BF16, MemoryCoefficients, MemoryEstimate, StagedLayout, stage_state_bytes, token_shape
from lcmoe.estimate.packing import real_token_share
from lcmoe.estimate.params import LayerSignature
from lcmoe.estimate.time import TimeCoefficients, stage_rates, time_amounts
from lcmoe.estimate.time.amounts import stage_signatures
from lcmoe.estimate.time.stage import launch_free_seconds
from lcmoe.layout import ParallelLayout, inflight_microbatch_chunks
from lcmoe.plan.plans import Plan, RankMode
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions

# The ceiling is raised by this relative margin so that a plan whose every other term is zero
# (its step time equal to the floor up to the order of float additions) stays under it.
CEILING_ROUNDING = 1e-9

LayerClass = tuple[int, int, int, int, int, bool, str, tuple[int, ...] | None, TrainingOptions]


def layer_class(layout: ParallelLayout, options: TrainingOptions) -> LayerClass:
    """What one layer's launch-free seconds read of a run (``estimate.time.amounts._layer_amounts``
    and ``stage_rates``' dense, expert, attention and TP rates): the layout's TP, CP, EP, ETP,
    MBS, sequence parallelism and CP exchange, and the options — not PP, VPP, DP or GBS, which
    only say how many layers a stage holds and how many microbatches a step runs."""
    return (
        layout.tp,
        layout.cp,
        layout.ep,
        layout.etp,
        layout.mbs,
        layout.sequence_parallel,
        layout.cp_comm_type,
        layout.hierarchical_context_parallel_sizes,
        options,
    )


@dataclass(slots=True)
class FloorMemo:
    """One search's floor seconds per layer signature and ``layer_class``: the layers of every
    layout of one class are timed once (on the first layout of the class that holds them)."""

    seconds: dict[tuple[LayerClass, LayerSignature], float] = field(default_factory=dict)


def layer_floor_seconds(run: RunConfig, staged: StagedLayout, coefficients: TimeCoefficients, memo: FloorMemo) -> None:
    """Fill ``memo`` with the floor seconds of each layer of ``run``: its launch-free dense,
    expert, attention, scan and elementwise compute plus its exposed TP and permute time
    (``estimate.time.stage.launch_free_seconds``), per microbatch on one GPU. A stage's
    microbatch time adds recompute, CP, EP, PP and exposed host time to these, each ≥ 0
    (``stage_time``), and none of them reads the recompute rung (the layers' amounts are counted
    without recompute), the offloads or the dispatcher / CUDA-graph / EP-overlap variants."""
    amounts = time_amounts(run, staged)
    rates = stage_rates(amounts, coefficients)
    key = layer_class(run.layout, run.options)
    for stage, timed in zip(staged.stages, amounts.stages, strict=True):
        for signature, group in zip(stage_signatures(run.model, stage), timed.groups, strict=True):
            seconds = launch_free_seconds(amounts, group, coefficients, rates)
            memo.seconds[(key, signature)] = seconds.compute + seconds.tp + seconds.permute


def step_seconds_floor(run: RunConfig, staged: StagedLayout, coefficients: TimeCoefficients, memo: FloorMemo) -> float:
    """A floor on the step time of every plan ``run`` (the candidate's starting options) can
    become: (M + (pp − 1)/vpp) × the largest stage sum of its layers' floor seconds
    (``layer_floor_seconds``). ``pipeline.combine`` takes (M + bubble) × the slowest stage's
    whole microbatch and adds the exposed DP, optimizer and activation-offload seconds (≥ 0);
    the output layer's GEMM is left out (a floor may leave out any term ≥ 0)."""
    key = layer_class(run.layout, run.options)
    worst = 0.0
    for stage in staged.stages:
        total = 0.0
        for signature, (_, count) in stage_signatures(run.model, stage).items():
            seconds = memo.seconds.get((key, signature))
            if seconds is None:
                layer_floor_seconds(run, staged, coefficients, memo)
                seconds = memo.seconds[(key, signature)]
            total += count * seconds
        worst = max(worst, total)
    lay = run.layout
    bubble = (lay.pp - 1) / lay.vpp if lay.pp > 1 else 0.0
    return worst * (max(lay.num_microbatches, 1) + bubble)


def throughput_ceiling(run: RunConfig, staged: StagedLayout, coefficients: TimeCoefficients, memo: FloorMemo) -> float:
    """tokens/s/GPU that no plan of ``run``'s candidate exceeds: its step's real tokens (as
    ``time_amounts`` counts them) / ``step_seconds_floor`` / GPUs, raised by CEILING_ROUNDING;
    inf when the floor is 0."""
    floor = step_seconds_floor(run, staged, coefficients, memo)
    if floor <= 0:
        return float("inf")
    lay, options = run.layout, run.options
    tokens = lay.gbs * options.seq_len * real_token_share(lay, options)
    return tokens / floor / lay.world_size * (1 + CEILING_ROUNDING)


def peak_floor_bytes(
    run: RunConfig, staged: StagedLayout, offloaded: TrainingOptions, coefficients: MemoryCoefficients
) -> float:
    """A floor on the reserved peak of every plan of ``run``'s candidate (``offloaded``: its
    options with the whole optimizer on the host), the largest stage's: (1 + fragmentation
    fraction) × (weights + weight copies + gradients, their DDP padding (state_overhead_fraction
    of the trained weights and gradients), the fixed workspace, and the stored activations'
    floor) + CUDA context + NCCL buffers. ``stage_peak`` takes the larger of the forward/backward
    moment (persistent state + activations + transients) and the optimizer step, and
    ``stage_memory`` adds fragmentation (a fraction of that), the context, NCCL and dispatcher
    buffers; the optimizer share, TE workspace, CUDA-graph pool, logits, transients and
    dispatcher buffers are ≥ 0 and left out. Activations: every layer keeps at least its input,
    2·T·h/sp bytes (a pre-norm block stores its norm input under any selective set and offload,
    ``norm_bytes``; full recompute keeps one per group of ``recompute_num_layers``,
    ``full_recompute_bytes``), × activation_scale × the stage's in-flight chunks
    (``inflight_microbatch_chunks``, over the mean chunk with VPP, as ``stage_activations``)."""
    lay, c = run.layout, coefficients
    shape = token_shape(lay, offloaded)
    checkpoint = BF16 * shape.tokens * run.model.hidden_size / shape.sp
    group = max(offloaded.recompute_num_layers, 1)
    fraction = c.fragmentation_fraction if offloaded.expandable_segments else c.fragmentation_fraction_no_expandable
    worst = 0.0
    for stage, params in zip(staged.stages, staged.params, strict=True):
        _, state = stage_state_bytes(run.model, lay, stage, offloaded, run.hardware.architecture, params)
        buffered = state.weights - state.frozen_weights + state.gradients
        held = state.weights + state.weight_copies + state.gradients + buffered * c.state_overhead_fraction
        chunks = [-(-(len(chunk.decoder_layers) + chunk.mtp_layers) // group) for chunk in stage.chunks]
        per_chunk = sum(chunks) / len(chunks) if lay.vpp > 1 else chunks[0]
        activations = c.activation_scale * checkpoint * per_chunk * inflight_microbatch_chunks(lay, stage.rank)
        allocated = held + c.workspace_bytes + activations
        worst = max(worst, (1 + fraction) * allocated + c.cuda_context_bytes + c.nccl_buffer_bytes)
    return worst


def variant_peak_floor_bytes(
    fitted: MemoryEstimate, options: TrainingOptions, coefficients: MemoryCoefficients
) -> float:
    """A floor on the reserved peak of every dispatcher / CUDA-graph / EP-overlap / CP-exchange
    variant of a fitted option set (``fitted``: its memory; ``options``: its options), the
    largest stage's: (1 + fragmentation fraction) × (its weights, weight copies, gradients, GPU
    optimizer share, their padding on the gradients and optimizer, the fixed workspace and its
    stored activations) + CUDA context + NCCL buffers, the terms of ``peak_floor_bytes``. The
    variants keep the rung and the offloads, so the same model state; they store no fewer
    activations (a captured router keeps the MoE norm output, ``moe_norm_recompute_allowed``;
    the CP exchange changes transients only), which holds while the allgather dispatcher (whose
    fitted ``allgather_moe_scale`` may store fewer) is not among them (the caller's check)."""
    c = coefficients
    fraction = c.fragmentation_fraction if options.expandable_segments else c.fragmentation_fraction_no_expandable
    worst = 0.0
    for stage in fitted.stages:
        held = stage.weights + stage.weight_copies + stage.gradients + stage.optimizer
        held += (stage.gradients + stage.optimizer) * c.state_overhead_fraction
        allocated = held + c.workspace_bytes + stage.activations
        worst = max(worst, (1 + fraction) * allocated + c.cuda_context_bytes + c.nccl_buffer_bytes)
    return worst


@dataclass(slots=True)
class Frontier:
    """What the fitted plans found so far guarantee about the search's output (see the module
    docstring). ``best``: the best rank value per parallel layout (TP, CP, PP, EP), the key of
    the diverse top list; ``roomy``: the best rank value of a plan with ≥ 20% of the GPU free
    (``conservative_fallback``'s first choice); ``peaks`` / ``speeds``: the Pareto staircase of
    the plans so far (peak ascending, tokens/s/GPU rising)."""

    top_k: int
    rank: RankMode
    best: dict[tuple[int, ...], float] = field(default_factory=dict)
    kth: float = float("-inf")
    roomy: float = float("-inf")
    peaks: list[float] = field(default_factory=list)
    speeds: list[float] = field(default_factory=list)

    def add(self, plan: Plan, key: tuple[int, ...]) -> None:
        """Take in one fitted plan (banded as ``_result`` ranks it)."""
        value = plan.rank_value(self.rank)
        if value > self.best.get(key, float("-inf")):
            self.best[key] = value
            if len(self.best) >= self.top_k:
                self.kth = sorted(self.best.values(), reverse=True)[self.top_k - 1]
        memory = plan.memory
        if memory.peak_reserved_bytes <= 0.8 * memory.capacity_bytes:
            self.roomy = max(self.roomy, value)
        self._add_point(memory.peak_reserved_bytes, plan.tokens_per_sec_per_gpu)

    def _add_point(self, peak: float, speed: float) -> None:
        index = bisect.bisect_right(self.peaks, peak)
        if index and self.speeds[index - 1] >= speed:
            return  # dominated by a point with no more memory
        end = index
        while end < len(self.peaks) and self.speeds[end] <= speed:
            end += 1
        self.peaks[index:end] = [peak]
        self.speeds[index:end] = [speed]

    def outranks(self, ceiling: float) -> bool:
        """Plans found so far rank above ``ceiling`` in k parallel layouts and among the roomy
        ones: a candidate under it enters neither the top list nor the fallback, and the best
        throughput is above it."""
        return self.kth > ceiling and self.roomy > ceiling

    def dominates(self, ceiling: float, peak_floor: float) -> bool:
        """A plan found so far has no more memory than ``peak_floor`` and more tokens/s/GPU than
        ``ceiling``: a candidate with those bounds is off the Pareto front (``pareto_front``
        keeps a plan only when it beats every plan with less or equal memory)."""
        index = bisect.bisect_right(self.peaks, peak_floor)
        return index > 0 and self.speeds[index - 1] > ceiling
