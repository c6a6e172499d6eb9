"""Coefficient-free amounts of a run: FLOPs by kernel kind and bytes by link, per layer, stage and
run (one GPU's share of one microbatch)."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.flops import flops_per_token, lora_model_flops_per_token
from lcmoe.estimate.fsdp import fsdp_extra_dp_bytes
from lcmoe.estimate.memory import (
    BF16,
    StagedLayout,
    StageParams,
    layer_activation_bytes,
    optimizer_shards,
    stage_trained_params_per_gpu,
    staged_layout,
    token_shape,
)
from lcmoe.estimate.memory.state import weight_bytes_per_param
from lcmoe.estimate.muon import MuonStepAmounts, muon_step_amounts
from lcmoe.estimate.packing import attention_lengths, bridge_core_length, real_token_share
from lcmoe.estimate.params import LayerSignature, attention_kind, layer_signature, lora_adapters
from lcmoe.estimate.time.communication import ep_link_shares
from lcmoe.estimate.time.layer_bytes import (
    attention_cp_bytes,
    dispatch_bytes,
    mixer_cp_a2a_bytes,
    moe_layer_bytes,
    tp_layer_bytes,
)
from lcmoe.estimate.time.layer_flops import gdn_token_heads, layer_flops_per_token
from lcmoe.estimate.time.offload import stage_offload_bytes
from lcmoe.estimate.time.paged_stash import stage_stash_amounts
from lcmoe.layout import ParallelLayout, PipelineStage
from lcmoe.run import RunConfig
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions, unchecked_replace

__all__ = [
    "ADAM_GPU_BYTES_PER_PARAM",
    "OFFLOAD_HOST_LINK_BYTES_PER_PARAM",
    "LayerAmounts",
    "RunAmounts",
    "StageAmounts",
    "adapter_flops_per_token",
    "attention_chunk",
    "attention_cp_bytes",
    "dense_gemm_kernels",
    "dispatch_bytes",
    "gemm_passes",
    "mixer_cp_a2a_bytes",
    "model_flops_per_token",
    "moe_layer_bytes",
    "no_recompute_options",
    "stage_layer_groups",
    "stage_signatures",
    "time_amounts",
    "tp_layer_bytes",
]


# ----- amounts (coefficient-free) ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LayerAmounts:
    """One layer of a group of identical layers on a stage: its work per microbatch on one GPU
    (``StageAmounts.counts`` says how many)."""

    dense_flops: float
    expert_flops: float
    attention_flops: float
    linear_flops: float
    up_projection_flops: float
    dense_mlp_flops: float
    elementwise_bytes: float
    tp_bytes: float
    cp_kv_bytes_per_step: float
    cp_a2a_bytes: float
    ep_bytes: float
    moe_token_bytes: float
    is_moe: bool
    cp_mixer_a2a_bytes: float = 0.0  # Mamba's CP all-to-all (whatever cp_comm_type says)
    mamba_scan_flops: float = 0.0
    kind: AttentionKind = AttentionKind.GQA
    has_mlp: bool = True
    # Dense GEMM kernels of the layer per microbatch, every pass (dense_gemm_kernels); each pays
    # GemmShapeCost.fixed_seconds.
    dense_gemm_kernels: float = 0.0
    # (tokens × GDN value heads, gdn_token_heads) of the layer's recurrence on this GPU per microbatch: under CP
    # each rank runs the whole sequence for heads/(TP·CP) heads (Megatron gdn.py a2a_cp_to_hp),
    # the same count as its s/(TP·CP) tokens × all heads.
    gdn_token_heads: float = 0.0

    @property
    def windowed_attention(self) -> bool:
        """Whether the layer's attention is a sliding window (rated at its window, not the chunk)."""
        return self.kind is AttentionKind.SWA


@dataclass(frozen=True, slots=True)
class StageAmounts:
    rank: int
    groups: tuple[LayerAmounts, ...]
    counts: tuple[int, ...]  # layers of each group
    logits_flops: float
    pp_bytes: float
    dp_bytes: float
    optimizer_gpu_bytes: float
    optimizer_host_params: float
    optimizer_host_bytes: float
    activation_offload_bytes: float = 0.0  # per microbatch, each way (offload.stage_offload_bytes)
    # The paged stash per microbatch: bytes stashed, and the part through the host pages
    # (paged_stash.stage_stash_amounts).
    paged_stash_bytes: float = 0.0
    paged_stash_spill_bytes: float = 0.0
    muon: MuonStepAmounts | None = None  # the Muon optimizer's step (estimate.muon); None under Adam
    fsdp_bytes: float = 0.0  # Megatron-FSDP's DP bytes beyond dp_bytes, per step (estimate.fsdp)


@dataclass(frozen=True, slots=True)
class RunAmounts:
    """Everything the step time needs that does not depend on fitted coefficients."""

    stages: tuple[StageAmounts, ...]
    gpu: str
    gemm_peak_flops_per_second: float
    bf16_peak_flops_per_second: float
    tensor_core: str
    hbm_bytes_per_second: float
    nvlink_bytes_per_second: float
    scaleout_bytes_per_second: float
    host_link_bytes_per_second: float
    tp_span: int
    cp: int
    cp_span: int
    cp_a2a: bool
    ep_local_share: float
    ep_remote_share: float
    dp_span: int
    nvlink_domain: int
    tokens_per_expert: float
    # Rows (tokens) of the dense GEMMs of one microbatch on a GPU: s·b/cp (sequence parallelism
    # gathers the TP group's tokens before each GEMM).
    dense_gemm_rows: float
    expert_gemm_size: float
    local_experts: float
    attention_chunk: float
    dispatcher: str
    ep_overlap: bool
    cuda_graph_scope: frozenset[str]
    recompute_granularity: str
    recompute_modules: frozenset[str]
    moe_imbalance: float
    num_microbatches: int
    pp: int
    vpp: int
    model_flops_per_step: float
    tokens_per_step: float
    world_size: int
    # GEMM passes per layer: forward, data gradient, weight gradient; a frozen (LoRA) base skips
    # the weight gradient (its adapters' GEMMs are counted apart, all three passes).
    gemm_passes: int = 3
    architecture: str = "hopper"
    # The FP8 dense peak (FLOP/s) beside the precision's own: NVFP4 expert GEMMs are rated from
    # the FP8-class ones (compute.grouped_peak_flops_per_second). 0 where the GPU has no FP8.
    fp8_peak_flops_per_second: float = 0.0
    # Keys each query of a sliding-window layer attends (ModelSpec.window_tokens; 0: no such
    # layer): its kernel's rate saturates on the window, not the chunk
    # (compute.window_attention_saturation).
    attention_window: float = 0.0
    # Bytes per dispatched element the layers' ep_bytes were counted at (dispatch_bytes).
    dispatch_bytes: float = float(BF16)
    # ``a2a+p2p``: the p2p ring's outer ranks (hierarchical_context_parallel_sizes[1]) and the
    # GPUs its all-to-all group spans (tp·a); 0 for every other CP exchange (attention_cp_bytes).
    cp_outer_ring: int = 0
    cp_a2a_span: int = 0

    @property
    def gemm_peak(self) -> float:
        """Alias of gemm_peak_flops_per_second (FLOP/s), for callers written before the unit names."""
        return self.gemm_peak_flops_per_second

    @property
    def bf16_peak(self) -> float:
        """Alias of bf16_peak_flops_per_second (FLOP/s), for callers written before the unit names."""
        return self.bf16_peak_flops_per_second


def model_flops_per_token(
    model: ModelSpec, options: TrainingOptions, tp: int, *, layout: ParallelLayout | None = None
) -> float:
    """The FLOPs per pack token that TFLOP/s and MFU count: Bridge's training count
    (``estimate.flops``), or its LoRA count under LoRA (``estimate.flops.lora_model_flops_per_token``).
    Packed documents (``options.doc_lengths``, with ``layout``) change Bridge's attention length
    factor only where Bridge counts them (CP = 1, ``estimate.packing.bridge_core_length``)."""
    core_len = bridge_core_length(layout, options) if layout is not None else None
    breakdown = flops_per_token(model, options.seq_len, tp=tp, core_len=core_len)
    return lora_model_flops_per_token(breakdown) if options.is_lora else breakdown.total


def attention_chunk(layout: ParallelLayout, options: TrainingOptions, *, sparse: bool = False) -> float:
    """Query rows one attention kernel call works on, per rank: s/cp, halved under CP (the two
    load-balance chunks). Packed documents: each document d runs as its own 2·CP chunks of
    d/(2·CP); the kernel-saturation time Σ F_d·(1 + L½/c_d)/R with F_d ∝ d² and c_d ∝ d equals
    that of one chunk of the FLOP-weighted harmonic mean, Σd²/Σd = ŝ (DocLengths.attention_length),
    so ŝ takes the place of s. ``sparse`` (DSA): the top-k core's work is ∝ d, not d², so that
    weighting does not hold; it keeps the fixed-length chunk (lcmoe has no per-document measure
    of the sparse kernel)."""
    docs = options.doc_lengths
    length = options.seq_len if docs is None or sparse else docs.attention_length(options.seq_len)
    return length / layout.cp / (2 if layout.cp > 1 else 1)


def gemm_passes(options: TrainingOptions) -> int:
    """GEMM passes of a trained linear: forward, data gradient and weight gradient (3); a frozen
    LoRA base runs no weight gradient (2)."""
    return 2 if options.is_lora else 3


def adapter_flops_per_token(model: ModelSpec, layer: int, options: TrainingOptions) -> tuple[float, float]:
    """(dense, expert) adapter FLOPs per token of a layer, forward + backward, on the per-layer
    scale of ``layer_flops_per_token`` (a GPU's FLOPs = this × its s·b/(tp·cp) tokens): 6·r·(in +
    out) per dense adapter, × topk for a routed-expert adapter, which every routed token passes
    (as ``expert_gemm_flops_per_moe_layer`` counts the experts). Zero without LoRA."""
    if not options.is_lora:
        return 0.0, 0.0
    dense = expert = 0.0
    for adapter in lora_adapters(model, layer, options.lora_targets):
        flops = 6.0 * adapter.params(options.lora_rank)
        if adapter.expert:
            expert += flops * model.moe_router_topk
        else:
            dense += flops
    return dense, expert


def dense_gemm_kernels(model: ModelSpec, layer: int, passes: int) -> float:
    """Dense GEMM kernels one layer launches per microbatch: its linear layers × ``passes``
    (forward, data gradient, weight gradient). Mixer: GQA/SWA QKV + output (2); MLA the q down/up
    (or one q projection), kv down/up and output (4–5), plus a DSA indexer layer's q and k (2);
    Gated DeltaNet and Mamba in_proj + out_proj (2). MLP: fc1 + fc2 (2); a MoE layer its router
    gate (1), shared expert (2) and LatentMoE's two projections (2). (Megatron's layer specs:
    gpt_layer_specs.py, multi_latent_attention.py, gated_delta_net/gdn.py, mamba_mixer.py,
    moe_layer.py.)"""
    kind = attention_kind(model, layer)
    mixer = 0
    if kind is AttentionKind.MLA:
        mixer = 5 if model.q_lora_rank else 4
        mixer += 2 if model.is_dsa and model.has_dsa_indexer(layer) else 0
    elif kind is not AttentionKind.NONE:
        mixer = 2
    mlp = 0
    if model.is_moe_layer(layer):
        mlp = 1 + 2 * (model.shared_ffn > 0) + 2 * bool(model.moe_latent_size)
    elif model.has_mlp(layer):
        mlp = 2
    return float((mixer + mlp) * passes)


def _layer_amounts(run: RunConfig, layer: int, no_recompute: TrainingOptions) -> LayerAmounts:
    """One layer's amounts (the stage counts its group's layers). ``no_recompute``: the
    run's options without recompute (what the forward touches once)."""
    model, layout, options = run.model, run.layout, run.options
    tokens = options.seq_len * layout.mbs / (layout.tp * layout.cp)  # this GPU's share of the microbatch
    lengths = attention_lengths(model, layout, options)  # packed documents; None: fixed length
    f = layer_flops_per_token(
        model,
        layer,
        options.seq_len,
        core_len=lengths.core if lengths else None,
        window_len=lengths.window if lengths else None,
    )
    base_share = gemm_passes(options) / 3
    adapter_dense, adapter_expert = adapter_flops_per_token(model, layer, options)
    kind = attention_kind(model, layer)
    cp_kv, cp_a2a = attention_cp_bytes(run, layer)
    ep_bytes, moe_token_bytes = moe_layer_bytes(run, layer)
    return LayerAmounts(
        dense_flops=(f.dense_gemm * base_share + adapter_dense) * tokens,
        expert_flops=(f.expert_gemm * base_share + adapter_expert) * tokens,
        attention_flops=f.attention_core * tokens,
        linear_flops=f.linear_attention * base_share * tokens,
        up_projection_flops=f.up_projection * tokens,
        dense_mlp_flops=f.dense_mlp * tokens,
        elementwise_bytes=layer_activation_bytes(model, layer, token_shape(layout, options), no_recompute),
        tp_bytes=tp_layer_bytes(run, layer),
        cp_kv_bytes_per_step=cp_kv,
        cp_a2a_bytes=cp_a2a if layout.cp_comm_type in ("a2a", "a2a+p2p") else 0.0,
        ep_bytes=ep_bytes,
        moe_token_bytes=moe_token_bytes,
        is_moe=model.is_moe_layer(layer),
        cp_mixer_a2a_bytes=mixer_cp_a2a_bytes(run, kind),
        mamba_scan_flops=f.mamba_scan * tokens,
        kind=kind,
        has_mlp=model.has_mlp(layer),
        dense_gemm_kernels=dense_gemm_kernels(model, layer, gemm_passes(options)),
        gdn_token_heads=gdn_token_heads(tokens, model) if kind is AttentionKind.GDN else 0.0,
    )


# HBM bytes an Adam step touches per GPU-resident parameter (fused Adam, fp32 master weights and
# moments): reads param, grad, m, v (4 × 4 B) and writes param, m, v (3 × 4 B) = 28.
ADAM_GPU_BYTES_PER_PARAM = 28
# Host-link bytes per offloaded parameter and step: its fp32 gradient to the host (4 B) and its
# BF16 parameter back (2 B) (Megatron's HybridDeviceOptimizer, optimizer_cpu_offload).
OFFLOAD_HOST_LINK_BYTES_PER_PARAM = 6


def no_recompute_options(options: TrainingOptions) -> TrainingOptions:
    """``options`` without recompute: what a forward touches once (the layers' elementwise bytes):
    every stored tensor, the offloaded ones too (they are written before they leave; the copies
    are priced apart, offload.stage_offload_bytes), at the tokens the experts receive rather than
    a static budget's buffer size (the fused grouped MLP walks only the received tokens,
    transformer_config.py:955-961; the paged stash's copies are priced apart, time.paged_stash)."""
    return unchecked_replace(
        options,
        recompute_granularity="none",
        recompute_modules=frozenset(),
        activation_offload_modules=frozenset(),
        moe_expert_rank_capacity_factor=None,
        moe_paged_stash=False,
    )


def stage_signatures(model: ModelSpec, stage: PipelineStage) -> dict[LayerSignature, list[int]]:
    """The stage's groups of identical layers, in order: signature → [first layer, layers]."""
    # MTP layers are transformer layers of the last decoder layer's kind (hybrid: the MTP depth).
    counts = {layer_signature(model, first): [first, count] for first, count in stage.layer_groups}
    if stage.mtp_layers:
        mtp = model.mtp_layer
        counts.setdefault(layer_signature(model, mtp), [mtp, 0])[1] += stage.mtp_layers
    return counts


def stage_layer_groups(
    run: RunConfig,
    stage: PipelineStage,
    per_signature: dict[LayerSignature, LayerAmounts],
    no_recompute: TrainingOptions,
) -> tuple[tuple[LayerAmounts, ...], tuple[int, ...]]:
    """(one layer's amounts per group of identical layers of ``stage``, the layers in each):
    ``per_signature`` is shared by the run's stages (filled here)."""
    counts = stage_signatures(run.model, stage)
    if any(key not in per_signature for key in counts):
        for key, (first, _) in counts.items():
            if key not in per_signature:
                per_signature[key] = _layer_amounts(run, first, no_recompute)
    return tuple(per_signature[key] for key in counts), tuple(count for _, count in counts.values())


def _stage_amounts(
    run: RunConfig,
    stage: PipelineStage,
    stage_params: StageParams,
    per_signature: dict[LayerSignature, LayerAmounts],
    no_recompute: TrainingOptions,
) -> StageAmounts:
    """``stage_params``: the stage's parameters per GPU; ``per_signature``: one layer's amounts
    per signature, shared by the run's stages (filled here); ``no_recompute``: the run's options
    without recompute (what a forward touches once)."""
    model, layout, options = run.model, run.layout, run.options
    groups, group_counts = stage_layer_groups(run, stage, per_signature, no_recompute)
    tokens = options.seq_len * layout.mbs / (layout.tp * layout.cp)
    logits = 0.0
    if stage.has_loss:
        passes = 2.0 * gemm_passes(options)
        logits = passes * model.hidden_size * model.padded_vocab_size(layout.tp) * (1 + stage.mtp_layers) * tokens
    shape = token_shape(layout, options)
    pp_bytes = 2 * shape.tokens * model.hidden_size * BF16 / shape.sp if layout.pp > 1 else 0.0
    params = stage_trained_params_per_gpu(model, layout, stage, options, stage_params)
    grad_bytes = 4.0 if options.main_grads_dtype == "fp32" else 2.0
    dense_dp, edp = layout.dp * layout.cp, max(layout.edp, 1)
    dp_bytes = (
        params.dense * (grad_bytes + 2) * (dense_dp - 1) / dense_dp + params.expert * (grad_bytes + 2) * (edp - 1) / edp
    )
    dense_shard, expert_shard = optimizer_shards(layout, options)
    local = params.dense / dense_shard + params.expert / expert_shard
    offloaded = local * options.optimizer_offload_fraction
    return StageAmounts(
        rank=stage.rank,
        groups=groups,
        counts=group_counts,
        logits_flops=logits,
        pp_bytes=pp_bytes,
        dp_bytes=dp_bytes,
        optimizer_gpu_bytes=(local - offloaded) * ADAM_GPU_BYTES_PER_PARAM,
        optimizer_host_params=offloaded,
        optimizer_host_bytes=offloaded * OFFLOAD_HOST_LINK_BYTES_PER_PARAM,
        activation_offload_bytes=stage_offload_bytes(run, stage),
        **dict(zip(("paged_stash_bytes", "paged_stash_spill_bytes"), stage_stash_amounts(run, stage), strict=True)),
        muon=muon_step_amounts(
            model, layout, stage, options, (params.dense, params.expert), shards=(dense_shard, expert_shard)
        ),
        fsdp_bytes=fsdp_extra_dp_bytes(
            (params.dense, params.expert),
            (dense_dp, edp),
            num_microbatches=layout.num_microbatches,
            weight_bytes=weight_bytes_per_param(options),
            grad_bytes=grad_bytes,
            options=options,
        ),
    )


def _run_stages(run: RunConfig, staged: StagedLayout) -> tuple[StageAmounts, ...]:
    """Every stage's amounts; identical layers (one signature) are counted once for all stages."""
    per_signature: dict[LayerSignature, LayerAmounts] = {}
    no_recompute = no_recompute_options(run.options)
    return tuple(
        _stage_amounts(run, stage, params, per_signature, no_recompute)
        for stage, params in zip(staged.stages, staged.params, strict=True)
    )


def time_amounts(run: RunConfig, staged: StagedLayout | None = None) -> RunAmounts:
    """The coefficient-free amounts of a run: FLOPs by kind and bytes by link, per stage.
    ``staged`` (``staged_layout`` of the run's model and layout) may be passed when the caller
    already has it (the planner does)."""
    model, layout, hardware, options = run.model, run.layout, run.hardware, run.options
    shape = token_shape(layout, options)
    local_experts = max((model.num_moe_experts or 1) / layout.ep, 1.0)
    local, remote = ep_link_shares(model, layout.ep, layout.etp, hardware.nvlink_domain_size, options.dispatcher)
    # Training tokens per step: the packs' real document tokens (all of them for fixed length).
    tokens = layout.gbs * options.seq_len * real_token_share(layout, options)
    return RunAmounts(
        stages=_run_stages(run, staged or staged_layout(model, layout)),
        gpu=hardware.name,
        gemm_peak_flops_per_second=hardware.peak(options.tensor_core_precision),
        bf16_peak_flops_per_second=hardware.peak("bf16"),
        fp8_peak_flops_per_second=hardware.peak("fp8") if hardware.supports("fp8") else 0.0,
        tensor_core=options.tensor_core_precision,
        hbm_bytes_per_second=hardware.hbm_bandwidth,
        nvlink_bytes_per_second=hardware.nvlink_bandwidth,
        scaleout_bytes_per_second=hardware.scaleout_bandwidth,
        host_link_bytes_per_second=hardware.host_link_bandwidth,
        tp_span=layout.tp,
        cp=layout.cp,
        cp_span=layout.tp * layout.cp,
        cp_a2a=layout.cp_comm_type in ("a2a", "a2a+p2p"),
        ep_local_share=local,
        ep_remote_share=remote,
        dp_span=layout.world_size // layout.pp,
        nvlink_domain=hardware.nvlink_domain_size,
        tokens_per_expert=shape.tokens / shape.sp * model.moe_router_topk * layout.etp / local_experts,
        dense_gemm_rows=options.seq_len * layout.mbs / layout.cp,
        expert_gemm_size=model.expert_width * model.expert_ffn / layout.etp if model.is_moe else 0.0,
        local_experts=local_experts if model.is_moe else 0.0,
        attention_chunk=attention_chunk(layout, options, sparse=model.is_dsa),
        attention_window=float(model.window_tokens),
        dispatcher=options.dispatcher,
        ep_overlap=options.overlap_moe_expert_parallel_comm,
        cuda_graph_scope=frozenset(options.cuda_graph_scope),
        recompute_granularity=options.recompute_granularity,
        recompute_modules=options.recompute_modules,
        moe_imbalance=options.moe_token_imbalance,
        num_microbatches=max(layout.num_microbatches, 1),
        pp=layout.pp,
        vpp=layout.vpp,
        # Bridge counts every pack slot (S1 = padded tokens, flop_utils.py:258-360).
        model_flops_per_step=model_flops_per_token(model, options, layout.tp, layout=layout)
        * layout.gbs
        * options.seq_len,
        tokens_per_step=tokens,
        world_size=layout.world_size,
        gemm_passes=gemm_passes(options),
        architecture=hardware.architecture,
        dispatch_bytes=dispatch_bytes(options),
        cp_outer_ring=layout.cp_ring_size if layout.cp_comm_type == "a2a+p2p" else 0,
        cp_a2a_span=layout.tp * layout.cp_a2a_size if layout.cp_comm_type == "a2a+p2p" else 0,
    )
