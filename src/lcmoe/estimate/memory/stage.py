"""Assembling the peak of one pipeline stage from its named pieces (``stage_memory``) and of
every stage (``estimate_memory``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lcmoe.estimate.memory.activations import TokenShape, token_shape
from lcmoe.estimate.memory.coefficients import MemoryCoefficients, shipped_coefficients
from lcmoe.estimate.memory.constants import DEFAULT_NVLINK_DOMAIN
from lcmoe.estimate.memory.layers import (
    chunk_layer_bytes,
    embedding_activation_bytes,
    full_recompute_bytes,
    offload_host_bytes,
    offload_inflight_bytes,
)
from lcmoe.estimate.memory.paged_stash import stage_stash_bytes
from lcmoe.estimate.memory.results import MemoryEstimate, StageMemory
from lcmoe.estimate.memory.state import (
    ModelState,
    StagedLayout,
    StageParams,
    optimizer_grad_copy_bytes,
    stage_state_bytes,
    staged_layout,
)
from lcmoe.estimate.memory.transients import (
    cuda_graph_pool_bytes,
    dispatcher_buffer_bytes,
    logits_loss_bytes,
    moe_dispatch_transient_bytes,
    replayed_options,
    stage_holds,
    stage_mixer_transients,
    te_workspace_bytes,
)
from lcmoe.estimate.params import LayerSignature
from lcmoe.layout import ModelChunk, ParallelLayout, PipelineStage, inflight_microbatch_chunks
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions

# A model chunk by what ``chunk_activation_bytes`` reads of it: its decoder layers, MTP layers and
# whether it holds the embedding.
ChunkKey = tuple[tuple[int, ...], int, bool]
# Per-layer stored activations by layer signature: under the options, and under their
# recompute-free replay (``replayed_options``); and ``chunk_activation_bytes`` per chunk. A memo
# shared by one estimate's stages (or, through ``SharedLayerBytes``, by the estimates of one
# token shape, options and MoE scale: all that those functions read besides the model and chunk).
LayerCache = tuple[dict[LayerSignature, float], dict[LayerSignature, float], dict[ChunkKey, tuple[float, float]]]


@dataclass(frozen=True, slots=True)
class StageInputs:
    """What every stage of one estimate shares: the run, the fitted coefficients, the GPU
    (``architecture``, ``nvlink_domain``), whether the peak is the first step's, the options a
    layer's backward replays under (``replayed_options(options)``) and the per-layer memo."""

    model: ModelSpec
    layout: ParallelLayout
    options: TrainingOptions
    coefficients: MemoryCoefficients
    replayed: TrainingOptions
    first_step: bool = False
    architecture: str = "hopper"
    nvlink_domain: int = DEFAULT_NVLINK_DOMAIN
    known: LayerCache = field(default_factory=lambda: ({}, {}, {}))
    shape: TokenShape | None = None  # token_shape(layout, options), when built by stage_inputs

    @property
    def moe_scale(self) -> float:
        """The allgather dispatcher keeps gathered copies of every TP·EP rank's tokens that the
        per-tensor physics does not list; their size is fitted (``allgather_moe_scale``)."""
        return moe_scale_of(self.options, self.coefficients)


def moe_scale_of(options: TrainingOptions, coefficients: MemoryCoefficients) -> float:
    """``StageInputs.moe_scale`` of these options and coefficients."""
    return coefficients.allgather_moe_scale if options.dispatcher == "allgather" else 1.0


@dataclass(slots=True)
class SharedLayerBytes:
    """Per-layer stored activations shared by many estimates of one model: a plan search
    estimates about 9 500 (layout, options) pairs, and the layouts that differ only in PP, VPP
    or DP share their token shape, so many pairs find their layers already computed by an
    earlier estimate (DeepSeek-V3 on 512 GPUs: 57 000 layer computations become 23 000).
    ``stage_inputs`` hands each estimate the ``LayerCache`` of its (token shape,
    options, MoE scale), and the replayed options of its options, instead of empty ones: the
    same values, since ``layer_activation_bytes`` reads nothing else. Lives for one caller's loop
    (the memo the style allows); estimates of another model do not use it."""

    model: ModelSpec
    replayed: dict[TrainingOptions, TrainingOptions] = field(default_factory=dict)
    layers: dict[tuple[TokenShape, TrainingOptions, float], LayerCache] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StageTerms:
    """The bytes one GPU of a stage holds, before choosing the peak moment."""

    state: ModelState
    activations: float  # stored activations of the in-flight microbatches
    logits: float  # logits/loss buffers (loss stage only)
    transient: float  # one layer's backward working set + dispatch + mixer scratch
    workspace: float
    graphs: float  # TE-scoped CUDA-graph buffers
    grad_copies: float  # FP32 gradient copies of the optimizer step
    inflight: int


@dataclass(frozen=True, slots=True)
class StagePeak:
    """The peak moment and what is live at it (``StageMemory``'s ``*_at_peak`` fields)."""

    allocated: float
    state_overhead: float
    optimizer: float
    activations: float
    logits: float
    transient: float


def largest_replayed_layer(inputs: StageInputs, stage: PipelineStage, shape: TokenShape) -> float:
    """Under selective recompute a layer's backward works on what the replay rematerialises, so
    the largest working set is the largest layer without it: one layer per signature suffices."""
    if inputs.replayed is inputs.options:
        return 0.0
    representatives = tuple(first for first, _ in stage.layer_groups)
    full_layers = chunk_layer_bytes(
        inputs.model,
        representatives,
        min(stage.mtp_layers, 1),
        shape,
        inputs.replayed,
        moe_scale=inputs.moe_scale,
        known=inputs.known[1],
    )
    return max(full_layers, default=0.0)


def chunk_activation_bytes(inputs: StageInputs, chunk: ModelChunk, shape: TokenShape) -> tuple[float, float]:
    """(stored activations of one model chunk for one microbatch, its largest backward working
    set): the sum of its layers, or under full recompute ``full_recompute_bytes`` with the
    recomputed group of layers as the working set; plus the embedding on the first chunk.
    Kept in ``inputs.known`` per ``ChunkKey``: ``shape`` is ``inputs``' token shape (the one its
    memo is kept for), and nothing else of the chunk is read."""
    key = (chunk.decoder_layers, chunk.mtp_layers, chunk.embedding)
    known = inputs.known[2].get(key)
    if known is None:
        known = inputs.known[2][key] = _chunk_activation_bytes(inputs, chunk, shape)
    return known


def _chunk_activation_bytes(inputs: StageInputs, chunk: ModelChunk, shape: TokenShape) -> tuple[float, float]:
    """``chunk_activation_bytes`` computed."""
    model, options = inputs.model, inputs.options
    per_layer = chunk_layer_bytes(
        model, chunk.decoder_layers, chunk.mtp_layers, shape, options, moe_scale=inputs.moe_scale, known=inputs.known[0]
    )
    largest = max(per_layer, default=0.0)
    if options.recompute_granularity == "full":
        stored = full_recompute_bytes(per_layer, shape, model.hidden_size, options)
        largest = max(largest, sum(sorted(per_layer)[-options.recompute_num_layers :]))
    else:
        stored = sum(per_layer)
    if chunk.embedding:
        stored += embedding_activation_bytes(model, shape, options)
    return stored, largest


def stage_activations(
    inputs: StageInputs, stage: PipelineStage, shape: TokenShape, inflight: int
) -> tuple[float, float]:
    """(stored activations of the in-flight microbatches, the largest single-layer working set):
    activation_scale × chunk bytes × in-flight chunks, over the mean chunk with virtual pipeline
    stages (``inflight_microbatch_chunks`` counts chunks then), plus what activation offloading
    (``offload_inflight_bytes``) and the paged stash (``stage_stash_bytes``) hold on the GPU."""
    stored, largest_layer = _stored_activations(inputs, stage, shape, inflight)
    held = stage_stash_bytes(inputs.model, inputs.options, stage, shape, 0.0)[0]
    if inputs.options.activation_offload_modules:
        copies = inflight / max(inputs.layout.vpp, 1)
        held += offload_inflight_bytes(inputs.model, stage.layer_groups, shape, inputs.options, copies)
    return stored + inputs.coefficients.activation_scale * held, largest_layer


def _stored_activations(
    inputs: StageInputs, stage: PipelineStage, shape: TokenShape, inflight: int
) -> tuple[float, float]:
    """``stage_activations`` before what offloading keeps in flight."""
    largest_layer = largest_replayed_layer(inputs, stage, shape)
    chunk_bytes: list[float] = []
    for chunk in stage.chunks:
        stored, largest = chunk_activation_bytes(inputs, chunk, shape)
        largest_layer = max(largest_layer, largest)
        chunk_bytes.append(stored)
    scale = inputs.coefficients.activation_scale
    if inputs.layout.vpp > 1:
        return scale * (sum(chunk_bytes) / max(len(chunk_bytes), 1)) * inflight, largest_layer
    return scale * (chunk_bytes[0] * inflight), largest_layer


def stage_transient(inputs: StageInputs, stage: PipelineStage, shape: TokenShape, largest_layer: float) -> float:
    """One layer's backward working set (× transient_layer_scale) + the MoE dispatch buffers
    (× moe_dispatch_scale, MoE stages) + the larger of a mixer's kernel scratch (forward,
    replayed under recompute) and its backward working set, which come one after the other
    inside the layer's backward."""
    model, options, c = inputs.model, inputs.options, inputs.coefficients
    moe_layers = stage_holds(model, stage, model.is_moe_layer)
    dispatch = c.moe_dispatch_scale * moe_dispatch_transient_bytes(model, shape, options) if moe_layers else 0.0
    forward_scratch, backward_scratch = stage_mixer_transients(model, stage, shape, options)
    return c.transient_layer_scale * largest_layer + dispatch + max(forward_scratch, backward_scratch)


def stage_terms(inputs: StageInputs, stage: PipelineStage, shape: TokenShape, params: StageParams | None) -> StageTerms:
    """Every byte term of one GPU of the stage (``params``: its parameters when known)."""
    model, layout, options, c = inputs.model, inputs.layout, inputs.options, inputs.coefficients
    trained, state = stage_state_bytes(model, layout, stage, options, inputs.architecture, params)
    inflight = inflight_microbatch_chunks(layout, stage.rank)
    activations, largest_layer = stage_activations(inputs, stage, shape, inflight)
    logits = 0.0
    if stage.has_loss:
        logits = c.logits_scale * logits_loss_bytes(model, shape, options, 1 + stage.mtp_layers)
    return StageTerms(
        state=state,
        activations=activations,
        logits=logits,
        transient=stage_transient(inputs, stage, shape, largest_layer),
        workspace=c.workspace_bytes + te_workspace_bytes(model, options, inputs.architecture),
        graphs=cuda_graph_pool_bytes(model, shape, options, stage, inflight),
        grad_copies=optimizer_grad_copy_bytes(trained, layout, options),
        inflight=inflight,
    )


def stage_peak(terms: StageTerms, inputs: StageInputs) -> StagePeak:
    """The larger of two moments. Forward/backward: model state (+ DDP/optimizer padding, the
    fitted ``state_overhead_fraction``) + activations + the larger of the logits (the loss stage
    peaks while they are live, no layer being in backward then) and a layer's backward working
    set. Optimizer step: model state + the FP32 gradient copies, after the activations are
    freed, except that a captured full-iteration graph keeps its whole working set in its
    private pool between replays (released only with the graph; the first step runs eagerly).
    With ``first_step`` the forward/backward runs before the optimizer moments exist."""
    state, c, first_step = terms.state, inputs.coefficients, inputs.first_step
    overhead = state.buffered * c.state_overhead_fraction
    static = state.weights + state.gradients + state.optimizer + overhead
    moments = state.optimizer_moments * (1.0 + c.state_overhead_fraction)
    dynamic = terms.activations + max(terms.logits, terms.transient)
    persistent = static + state.weight_copies + terms.workspace + terms.graphs
    pinned = dynamic if "full_iteration" in inputs.options.cuda_graph_scope and not first_step else 0.0
    forward_backward = persistent - moments + dynamic if first_step else persistent + dynamic
    optimizer_step = persistent + pinned + terms.grad_copies
    optimizer_live = state.optimizer
    logits, transient = (terms.logits, 0.0) if terms.logits >= terms.transient else (0.0, terms.transient)
    activations = terms.activations
    if optimizer_step > forward_backward:  # peak in the optimizer step: the copies are the transient
        if not pinned:
            activations = logits = transient = 0.0
        transient += terms.grad_copies
    elif first_step:  # peak in the first backward, before the moments exist
        optimizer_live -= state.optimizer_moments
        overhead -= state.optimizer_moments * c.state_overhead_fraction
    peak = max(forward_backward, optimizer_step)
    return StagePeak(peak, overhead, optimizer_live, activations, logits, transient)


def stage_memory(inputs: StageInputs, stage: PipelineStage, params: StageParams | None = None) -> StageMemory:
    """Peak of one stage (``params``: the stage's parameters per GPU, ``StagedLayout``):
    ``stage_terms`` at the moment ``stage_peak`` picks, plus what only reserved memory holds:
    allocator fragmentation (a fitted fraction of the allocated peak, larger without expandable
    segments), the CUDA context, NCCL buffers and the DeepEP/HybridEP buffers."""
    c, options = inputs.coefficients, inputs.options
    shape = inputs.shape or token_shape(inputs.layout, options)
    terms = stage_terms(inputs, stage, shape, params)
    peak = stage_peak(terms, inputs)
    fraction = c.fragmentation_fraction if options.expandable_segments else c.fragmentation_fraction_no_expandable
    fragmentation = fraction * peak.allocated
    dispatcher = dispatcher_buffer_bytes(inputs.model, shape, options, nvlink_domain=inputs.nvlink_domain)
    reserved = peak.allocated + fragmentation + c.cuda_context_bytes + c.nccl_buffer_bytes + dispatcher
    state, copies = terms.state, terms.inflight / max(inputs.layout.vpp, 1)
    return StageMemory(
        stage=stage.rank,
        layers=len(stage.decoder_layers) + stage.mtp_layers,
        weights=state.weights,
        gradients=state.gradients,
        optimizer=state.optimizer,
        activations=terms.activations,
        logits_loss=terms.logits,
        transient=terms.transient,
        workspace=terms.workspace,
        peak_allocated=peak.allocated,
        fragmentation=fragmentation,
        cuda_context=c.cuda_context_bytes,
        nccl_buffers=c.nccl_buffer_bytes,
        cuda_graphs=terms.graphs,
        dispatcher_buffers=dispatcher,
        peak_reserved=reserved,
        optimizer_host=state.optimizer_host,
        inflight_microbatches=terms.inflight,
        state_overhead=peak.state_overhead,
        weight_copies=state.weight_copies,
        optimizer_at_peak=peak.optimizer,
        activations_at_peak=peak.activations,
        logits_at_peak=peak.logits,
        transient_at_peak=peak.transient,
        activations_host=offload_host_bytes(inputs.model, stage.layer_groups, shape, options, copies)
        + stage_stash_bytes(inputs.model, options, stage, shape, copies)[1],
    )


def attention_kernel(options: TrainingOptions, architecture: str) -> str:
    """The attention backend TE runs for ``options.attention_backend`` on this GPU generation.

    TE's ``get_attention_backend`` (transformer_engine/pytorch/attention/dot_product_attention/
    utils.py, "Disabling FusedAttention for determinism reasons"): in deterministic training the
    cuDNN F16 arbitrary-seqlen kernel is disabled below compute capability 9.0, and FlashAttention
    needs flash-attn >= 2.4.1. On an Ampere GPU with neither, ``auto`` falls back to
    UnfusedDotProductAttention, which stores the b·n/tp·s² softmax (core_attention_bytes).
    """
    backend = options.attention_backend
    if backend != "auto":
        return backend
    if options.deterministic and architecture == "ampere" and not options.flash_attn_installed:
        return "unfused"
    return "flash"


def stage_inputs(
    model: ModelSpec,
    hardware: HardwareSpec | None,
    layout: ParallelLayout,
    options: TrainingOptions,
    coefficients: MemoryCoefficients | None = None,
    *,
    first_step: bool = False,
    shared: SharedLayerBytes | None = None,
) -> StageInputs:
    """What ``stage_memory`` needs for every stage of one estimate. A caller that may stop after
    one stage (the planner: one stage over capacity already rules a trial out) builds it, asks
    ``stage_memory`` stage by stage and assembles the rest with ``memory_of_stages``. ``shared``:
    per-layer bytes kept across this caller's estimates of ``model`` (``SharedLayerBytes``)."""
    architecture = hardware.architecture if hardware else "hopper"
    # Only the unfused kernel stores differently (flash and fused keep the same tensors), so the
    # options are copied only then, not on every estimate of the planner's hot path.
    if options.attention_backend != "unfused" and attention_kernel(options, architecture) == "unfused":
        options = replace(options, attention_backend="unfused")
    coefficients = coefficients or shipped_coefficients()
    shape = token_shape(layout, options)
    known: LayerCache
    if shared is None or shared.model is not model:
        replayed, known = replayed_options(options), ({}, {}, {})
    else:
        replayed = shared.replayed.get(options) or shared.replayed.setdefault(options, replayed_options(options))
        key = (shape, options, moe_scale_of(options, coefficients))
        known = shared.layers.get(key) or shared.layers.setdefault(key, ({}, {}, {}))
    return StageInputs(
        model,
        layout,
        options,
        coefficients,
        replayed,
        first_step=first_step,
        architecture=architecture,
        nvlink_domain=hardware.nvlink_domain_size if hardware else DEFAULT_NVLINK_DOMAIN,
        known=known,
        shape=shape,
    )


def memory_of_stages(
    stages: tuple[StageMemory, ...], hardware: HardwareSpec | None, coefficients: MemoryCoefficients
) -> MemoryEstimate:
    """The estimate of every stage's ``stage_memory`` against the GPU's (and host's) memory."""
    capacity = hardware.hbm_bytes if hardware else float("inf")
    host = hardware.host_memory_bytes if hardware else float("inf")
    return MemoryEstimate(stages, capacity, host, coefficients.error_band)


def estimate_memory(
    model: ModelSpec,
    hardware: HardwareSpec | None,
    layout: ParallelLayout,
    options: TrainingOptions,
    coefficients: MemoryCoefficients | None = None,
    *,
    first_step: bool = False,
    staged: StagedLayout | None = None,
    shared: SharedLayerBytes | None = None,
) -> MemoryEstimate:
    """Peak memory of every pipeline stage (worst GPU of each); see ``stage_memory``.
    ``staged`` (``staged_layout`` of this model and layout) may be passed when the caller already
    has it (the planner does), and ``shared`` per-layer bytes kept across its estimates."""
    inputs = stage_inputs(model, hardware, layout, options, coefficients, first_step=first_step, shared=shared)
    staged = staged or staged_layout(model, layout)
    stages_memory = tuple(
        stage_memory(inputs, stage, params) for stage, params in zip(staged.stages, staged.params, strict=True)
    )
    return memory_of_stages(stages_memory, hardware, inputs.coefficients)
