"""Per-rank, per-pipeline-stage peak GPU memory for (long-context MoE) Megatron training.

Every term is bytes on one GPU. Symbols: T = s·b/cp tokens of one microbatch on one CP rank;
``sp = tp`` with sequence parallel (residual-stream tensors are split over TP) else 1;
``a`` = bytes of a stored GEMM input (2 in BF16, 1 when FP8 keeps an FP8 copy).

Peak allocated (``torch.cuda.max_memory_allocated``) = the larger of
  forward/backward:
    model state (weights + grads + optimizer, ``model_state_bytes``)
  + TE's cached FP8/FP4 copies of the linear weights (``quantized_weight_copy_bytes``)
  + stored activations of the in-flight microbatches (``chunk_layer_bytes`` × ``inflight_microbatch_chunks``)
  + logits/loss buffers on the stage holding the loss (``logits_loss_bytes``)
  + transients at the peak (one layer's backward working set, MoE dispatch buffers)
  + a fixed workspace (cuBLAS/TE workspaces, RNG states, small buffers)
  and the optimizer step: model state + workspace + FP32 gradient copies
  (``optimizer_grad_copy_bytes``) + what a full-iteration CUDA graph keeps pinned.
The few terms that physics cannot pin down (the transient multipliers and the workspace) are
coefficients fitted on measured runs and shipped as data (``lcmoe/data/memory_coefficients.yaml``,
fit by ``benchmarks/fit_memory.py``). Reserved (nvidia-smi) adds allocator fragmentation,
the CUDA context, NCCL buffers, CUDA-graph pools and DeepEP/HybridEP buffers.

Sources: Korthikanti et al. 2022 "Reducing Activation Recomputation" (Table 2, per-layer
stored tensors); Megatron-Core ``transformer_layer.py``, ``moe/token_dispatcher.py``,
``moe/experts.py``, ``tensor_parallel/cross_entropy.py``; Bridge ``theoretical_memory_utils.py``
(model-state bytes, megatron-bridge-facts.md §5.2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources

import yaml

from lcmoe.estimate.params import (
    LayerSignature,
    attention_kind,
    layer_params,
    layer_signature,
    lora_adapters,
    mtp_extra_params,
)
from lcmoe.layout import ParallelLayout, PipelineStage, inflight_microbatch_chunks, pipeline_stages
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions

BF16 = 2
FP32 = 4
# Bridge's full-iteration CUDA-graph bundle for dropless MoE pads every expert tensor to a static
# per-rank token budget and stashes what backward needs in preallocated GPU pages
# (perf_recipes ``set_full_iter_cg_configs``: moe_expert_rank_capacity_factor=1.5,
# moe_paged_stash=True, moe_paged_stash_buffer_size_factor_cuda=1.2; facts §7).
FULL_ITERATION_RANK_CAPACITY = 1.5
FULL_ITERATION_STASH_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class MemoryCoefficients:
    """Fitted multipliers (dimensionless unless stated) with their fit provenance.

    ``transient_layer_scale`` and ``moe_dispatch_scale`` stay at their physical value 1: the
    measured rank (loss stage) peaks at the loss, so no data constrains them (fit_memory.py)."""

    activation_scale: float = 1.0
    allgather_moe_scale: float = 1.0
    transient_layer_scale: float = 1.0
    logits_scale: float = 1.0
    moe_dispatch_scale: float = 1.0
    workspace_bytes: float = 0.0
    state_overhead_fraction: float = 0.0
    fragmentation_fraction: float = 0.045
    fragmentation_fraction_no_expandable: float = 0.36
    cuda_context_bytes: float = 0.55 * 1024**3
    nccl_buffer_bytes: float = 0.5 * 1024**3
    fit: dict[str, object] = field(default_factory=dict)

    @property
    def error_band(self) -> float:
        """How far a prediction may be from the measured peak: the 90th-percentile absolute error
        on the rows each fold did not see (``fit.grouped_5fold_cv.p90_abs_pct_err`` / 100, written
        by fit_memory.py); 0 when the coefficients carry no fit record."""
        cv = self.fit.get("grouped_5fold_cv")
        p90 = cv.get("p90_abs_pct_err") if isinstance(cv, dict) else None
        return float(p90) / 100 if isinstance(p90, int | float) else 0.0


@functools.cache
def shipped_coefficients() -> MemoryCoefficients:
    """The coefficients shipped with the package (fit on shared/reference by fit_memory.py)."""
    path = resources.files("lcmoe.data").joinpath("memory_coefficients.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return MemoryCoefficients()
    values = {k: float(v) for k, v in data.get("coefficients", {}).items()}
    return MemoryCoefficients(**values, fit=data.get("fit", {}))


# ----- model state ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage: dense (over TP) and expert (over EP·ETP);
    ``vocab`` is the embedding / output-layer share of ``dense`` (not run through TE's FP8 GEMMs)."""

    dense: float
    expert: float
    vocab: float = 0.0

    @property
    def linear(self) -> float:
        """Parameters of the TE linear layers (attention, MLP and expert GEMMs): everything but the
        embedding and output layer (norm and router weights are a rounding error here)."""
        return self.total - self.vocab

    @property
    def total(self) -> float:
        return self.dense + self.expert


def stage_params_per_gpu(model: ModelSpec, layout: ParallelLayout, stage: PipelineStage) -> StageParams:
    """dense = Σ layer dense params / tp (+ embedding/tp on the first stage, output/tp on the last,
    + embedding/tp again on the last when tied or when it holds MTP); expert = Σ routed / (ep·etp)
    (theoretical_memory_utils.py:546-612, per stage rather than first-stage only). A repeated MTP
    layer's weights count once (``ModelSpec.mtp_weight_layers``); LatentMoE projections are
    duplicated on every TP rank, not split."""
    dense = 0.0
    expert = 0.0
    replicated = 0.0  # dense parameters every TP rank holds in full (LatentMoE projections)
    for first, count in stage.layer_groups:
        lp = layer_params(model, first)
        dense += count * lp.dense
        expert += count * lp.routed_experts
        replicated += count * lp.tp_replicated
    if stage.mtp_layers:
        last = layer_params(model, model.mtp_layer)
        weight_layers = min(stage.mtp_layers, model.mtp_weight_layers)
        dense += weight_layers * (last.dense + mtp_extra_params(model))
        expert += weight_layers * last.routed_experts
        replicated += weight_layers * last.tp_replicated
    vocab_h = model.padded_vocab_size(layout.tp) * model.hidden_size
    vocab = 0.0
    if stage.has_embedding:
        vocab += vocab_h
    if stage.has_loss:
        dense += model.hidden_size  # final norm
        if model.untie_embeddings_and_output_weights:
            vocab += vocab_h
        if (not model.untie_embeddings_and_output_weights or stage.mtp_layers) and not stage.has_embedding:
            vocab += vocab_h  # tied output / MTP embedding copy on the last stage
    dense += vocab
    return StageParams(
        (dense - replicated) / layout.tp + replicated, expert / (layout.ep * layout.etp), vocab / layout.tp
    )


@dataclass(frozen=True, slots=True)
class StagedLayout:
    """A layout's pipeline stages and each stage's parameters per GPU: what every estimate of the
    layout shares whatever the options (the planner builds it once per layout and passes it)."""

    stages: tuple[PipelineStage, ...]
    params: tuple[StageParams, ...]


def staged_layout(model: ModelSpec, layout: ParallelLayout) -> StagedLayout:
    stages = tuple(pipeline_stages(model, layout))
    return StagedLayout(stages, tuple(stage_params_per_gpu(model, layout, stage) for stage in stages))


def stage_lora_params_per_gpu(
    model: ModelSpec, layout: ParallelLayout, stage: PipelineStage, options: TrainingOptions
) -> StageParams:
    """The trainable LoRA parameters on one GPU of a stage: r·(in + out)/tp per dense adapter and
    r·(in + out)/etp per routed-expert adapter (one per EP rank, shared by its local experts), over
    the stage's layers and MTP weight layers (``lcmoe.estimate.params.lora_adapters``). Both
    LoRA matrices are split over TP: a column-parallel base's LoRA-A is ColumnParallelLinear
    (h → r/tp, gathered) and its LoRA-B ColumnParallelLinear (r → out/tp); a row-parallel base's
    LoRA-A is RowParallelLinear (in/tp → r) (Bridge peft/utils.py ``ParallelLinearAdapter``)."""
    groups = list(stage.layer_groups)
    if stage.mtp_layers:
        groups.append((model.mtp_layer, min(stage.mtp_layers, model.mtp_weight_layers)))
    dense = expert = 0.0
    for first, count in groups:
        for adapter in lora_adapters(model, first, options.lora_targets):
            if adapter.expert:
                expert += count * adapter.params(options.lora_rank) / layout.etp
            else:
                dense += count * adapter.params(options.lora_rank) / layout.tp
    return StageParams(dense, expert)


def quantized_usage_bytes(options: TrainingOptions) -> float:
    """Bytes per parameter of one usage (row-wise or column-wise) of a quantized weight: MXFP8 and
    FP8 blockwise 1 B + 1/32 B of scales (one FP32 or E8M0 scale per 32–128 values, rounded up to
    MXFP8's), FP8 tensor-wise/delayed 1 B, NVFP4 0.5 B + 1/16 B of E4M3 scales."""
    if options.precision == "nvfp4":
        return 0.5 + 1 / 16
    if options.precision in ("mxfp8", "fp8-blockwise"):
        return 1.0 + 1 / 32
    return 1.0


def weight_bytes_per_param(options: TrainingOptions) -> float:
    """2 (BF16), or one row-wise usage of a quantized weight when the parameters are FP8/NVFP4
    tensors (``TrainingOptions.quantized_params``)."""
    return quantized_usage_bytes(options) if options.quantized_params else float(BF16)


def quantized_weight_copy_bytes(options: TrainingOptions, architecture: str) -> float:
    """Bytes per linear-layer parameter that Transformer Engine keeps besides the parameter itself:
    the quantized weights its FP8/FP4 GEMMs read. TE caches them between microbatches in the
    module's ``_fp8_workspaces`` (transformer_engine/pytorch/module/base.py
    ``get_weight_workspace``: "the tensor in the cache ... persists beyond a single forward
    pass"; Megatron passes ``is_first_microbatch`` so the cache is used), one row-wise usage for
    the forward GEMM and one column-wise usage for the data-gradient GEMM
    (``quantized_usage_bytes`` each). FP8 tensor-wise scaling has a single payload that only
    Hopper must also keep transposed (Blackwell GEMMs read it in either layout). With quantized
    parameters the parameter is the row-wise usage (``weight_bytes_per_param``) and only the
    column-wise one is added (base.py: quantized weights get ``update_usage(columnwise_usage=
    True)``). Megatron-FSDP gathers weights per module and keeps no transpose cache, so nothing
    persists there."""
    if not options.is_fp8 or options.megatron_fsdp:
        return 0.0
    row = col = quantized_usage_bytes(options)
    if options.precision in ("fp8-tensorwise", "fp8-delayed") and architecture == "blackwell":
        col = 0.0
    return col if options.quantized_params else row + col


def grad_bytes_per_param(options: TrainingOptions) -> float:
    """Main-gradient buffer: 4 (FP32, DDP default) or 2 (BF16 main grads)."""
    return float(FP32) if options.main_grads_dtype == "fp32" else float(BF16)


def master_param_bytes(options: TrainingOptions) -> float:
    """Master parameter bytes: 4 (FP32), or 2 when the precision-aware optimizer keeps them in
    FP16/BF16 (optimizer_config.py ``main_params_dtype``)."""
    return float(FP32) if options.main_params_dtype == "fp32" else float(BF16)


def optimizer_bytes_per_param(options: TrainingOptions) -> float:
    """Unsharded optimizer bytes per parameter: Adam = master (``master_param_bytes``) + two
    moments (4 each, or 2 in BF16, 1 in FP8 with the precision-aware optimizer); Muon = master +
    one momentum; SGD = master."""
    moment = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0}[options.exp_avg_dtype]
    master = master_param_bytes(options)
    if options.optimizer == "adam":
        return master + 2 * moment
    if options.optimizer == "muon":
        return master + moment
    return master


def optimizer_shards(layout: ParallelLayout, options: TrainingOptions) -> tuple[int, int]:
    """(dense, expert) shard counts of the distributed optimizer: dense over DP·CP, experts over
    EDP, each divided by the number of optimizer instances (facts §5.2; distrib_optimizer.py)."""
    if not options.distributed_optimizer and not options.megatron_fsdp:
        return 1, 1
    instances = max(options.num_distributed_optimizer_instances, 1)
    dense = max(layout.dp * layout.cp // instances, 1)
    expert = max(max(layout.edp, 1) // instances, 1)
    return dense, expert


@dataclass(frozen=True, slots=True)
class ModelState:
    """Model-state bytes on one GPU. ``optimizer_master`` exists from initialisation;
    ``optimizer_moments`` (Adam/Muon moments) are created lazily inside the first
    ``optimizer.step()``, so the first step's forward/backward runs without them."""

    weights: float
    gradients: float
    optimizer_master: float
    optimizer_moments: float
    optimizer_host: float
    weight_copies: float = 0.0
    # The part of ``weights`` that is frozen (a LoRA base): plain tensors outside DDP's padded
    # parameter and gradient buffers.
    frozen_weights: float = 0.0

    @property
    def optimizer(self) -> float:
        return self.optimizer_master + self.optimizer_moments

    @property
    def buffered(self) -> float:
        """What sits in DDP's and the distributed optimizer's padded, bucketed buffers (the basis
        of the fitted ``state_overhead_fraction``): trained weights, gradients, optimizer."""
        return self.weights - self.frozen_weights + self.gradients + self.optimizer


def model_state_bytes(
    params: StageParams,
    layout: ParallelLayout,
    options: TrainingOptions,
    *,
    architecture: str = "hopper",
    trainable: StageParams | None = None,
) -> ModelState:
    """weights = P_linear·w + P_vocab·2 (quantized parameters are the TE linear weights only: the
    embedding and output layer stay BF16); grads = P·g; optimizer = P_dense·o/shard_dense +
    P_expert·o/shard_expert, times (1 − offload fraction) on the GPU and the rest on the host;
    weight copies = P_linear·``quantized_weight_copy_bytes``. Megatron-FSDP also shards
    weights and gradients over the same groups. With ``trainable`` (LoRA adapters,
    ``stage_lora_params_per_gpu``) the base is frozen: Megatron's DDP buffers and the optimizer
    cover only parameters that require grad, so grads and optimizer count the adapters, whose
    BF16 weights add to the base's."""
    trained = params if trainable is None else trainable
    w, g, o = weight_bytes_per_param(options), grad_bytes_per_param(options), optimizer_bytes_per_param(options)
    shard_dense, shard_expert = optimizer_shards(layout, options)
    optimizer = trained.dense * o / shard_dense + trained.expert * o / shard_expert
    if options.megatron_fsdp:
        sharded = params.dense / shard_dense + params.expert / shard_expert
        vocab = params.vocab / shard_dense
        held = trained.dense / shard_dense + trained.expert / shard_expert
    else:  # without FSDP every parameter is held whole
        sharded, vocab, held = params.total, params.vocab, trained.total
    weights, grads = (sharded - vocab) * w + vocab * BF16, held * g
    frozen = 0.0
    if trainable is not None:
        frozen = weights
        weights += held * BF16
    on_gpu = 1.0 - options.optimizer_offload_fraction
    master_share = master_param_bytes(options) / o
    return ModelState(
        weights,
        grads,
        optimizer * master_share * on_gpu,
        optimizer * (1 - master_share) * on_gpu,
        optimizer * options.optimizer_offload_fraction,
        params.linear * quantized_weight_copy_bytes(options, architecture),
        frozen,
    )


def stage_trained_params_per_gpu(
    model: ModelSpec,
    layout: ParallelLayout,
    stage: PipelineStage,
    options: TrainingOptions,
    params: StageParams | None = None,
) -> StageParams:
    """The parameters that train on one GPU of a stage: all of them (``params`` when the caller
    has them), or under LoRA the adapters."""
    if options.is_lora:
        return stage_lora_params_per_gpu(model, layout, stage, options)
    return params or stage_params_per_gpu(model, layout, stage)


def stage_state_bytes(
    model: ModelSpec,
    layout: ParallelLayout,
    stage: PipelineStage,
    options: TrainingOptions,
    architecture: str,
    params: StageParams | None = None,
) -> tuple[StageParams, ModelState]:
    """(trained parameters, model state) of one GPU of a stage (``stage_trained_params_per_gpu``;
    ``params``: the stage's parameters when the caller has them)."""
    params = params or stage_params_per_gpu(model, layout, stage)
    if not options.is_lora:
        return params, model_state_bytes(params, layout, options, architecture=architecture)
    adapters = stage_lora_params_per_gpu(model, layout, stage, options)
    return adapters, model_state_bytes(params, layout, options, architecture=architecture, trainable=adapters)


def optimizer_grad_copy_bytes(params: StageParams, layout: ParallelLayout, options: TrainingOptions) -> float:
    """FP32 copies of the gradient shard made inside ``optimizer.step()`` when the DDP gradient
    buffer is BF16 and the optimizer is not precision-aware: (P_dense/shard_dense +
    P_expert/shard_expert)·4·(1 − offload fraction). The distributed optimizer sets
    ``shard_main_param.grad = shard_model_grad.float()`` (distrib_optimizer.py:2756-2800,
    ``_copy_model_grads_to_main_grads``); a precision-aware optimizer, whatever its moment dtype,
    reads the BF16 shard in place (``decoupled_grad``, distrib_optimizer.py:2783-2790) and
    Megatron-FSDP keeps its own buffers, so neither copies."""
    if options.main_grads_dtype != "bf16" or options.precision_aware_optimizer or options.megatron_fsdp:
        return 0.0
    shard_dense, shard_expert = optimizer_shards(layout, options)
    shard_params = params.dense / shard_dense + params.expert / shard_expert
    return FP32 * shard_params * (1.0 - options.optimizer_offload_fraction)


# ----- activations ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TokenShape:
    """Tokens of one microbatch on one rank: ``tokens`` = s·b/cp, ``sp`` the SP divisor (tp or 1)."""

    tokens: float
    tp: int
    sp: int
    etp: int
    ep: int
    stored_gemm_input: float  # a: 2 in BF16, 1 with FP8, 0 for a frozen LoRA base
    seq_len: int
    mbs: int
    cp: int
    cp_comm_type: str = "p2p"


def token_shape(layout: ParallelLayout, options: TrainingOptions) -> TokenShape:
    return TokenShape(
        tokens=options.seq_len * layout.mbs / layout.cp,
        tp=layout.tp,
        sp=layout.tp if layout.sequence_parallel else 1,
        etp=layout.etp,
        ep=layout.ep,
        # A frozen (LoRA) base keeps no GEMM inputs: TE saves one only for a weight gradient.
        stored_gemm_input=0.0 if options.is_lora else 1.0 if options.is_fp8 else float(BF16),
        seq_len=options.seq_len,
        mbs=layout.mbs,
        cp=layout.cp,
        cp_comm_type=layout.cp_comm_type,
    )


def norm_bytes(shape: TokenShape, h: int, options: TrainingOptions, *, standalone: bool) -> float:
    """A pre-norm block stores the norm input 2·T·h/sp and its output a·T·h/sp (the next GEMM's
    input). Selective ``layernorm`` recompute drops the output only of a standalone norm module:
    Megatron checkpoints a norm only when it is not an IdentityOp (transformer_layer.py,
    TransformerLayer.__init__, ``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm``).
    With the TE layer spec the attention norm of GQA/SWA and Gated DeltaNet blocks and the dense
    MLP's norm are fused into the next GEMM (TELayerNormColumnParallelLinear saves the same two
    tensors) and stay stored; MLA's input norm and the MoE block's pre-MLP norm are standalone
    TENorm modules (gpt_layer_specs.py, ``pre_mlp_layernorm=TENorm if num_experts else
    IdentityOp``; the MLA spec's ``input_layernorm=TENorm``)."""
    stored = BF16 * shape.tokens * h / shape.sp
    if not (standalone and options.recomputes("layernorm")):
        stored += shape.stored_gemm_input * shape.tokens * h / shape.sp
    return stored


def moe_norm_recompute_allowed(options: TrainingOptions) -> bool:
    """Megatron keeps the MoE pre-MLP norm output when the TE CUDA graph captures the router but
    not the alltoall preprocess: the output is then a static graph buffer that cannot be freed
    (transformer_layer.py, ``can_recompute_pre_mlp_layernorm_for_cudagraph``)."""
    scopes = options.cuda_graph_scope
    if "moe_router" not in scopes:
        return True
    return "moe_preprocess" in scopes and options.dispatcher == "alltoall"


def dropout_mask_bytes(shape: TokenShape, h: int, probability: float) -> float:
    """Bias-dropout-add keeps a 1-byte mask of T·h/sp when dropout is on."""
    return shape.tokens * h / shape.sp if probability > 0 else 0.0


def core_attention_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, q_dim: int, v_dim: int
) -> float:
    """Flash/fused attention stores its output 2·T·n·dv/tp and the FP32 log-sum-exp 4·T·n/tp;
    unfused attention also keeps the b·n/tp·s² softmax (2 B), and with attention dropout its
    mask (1 B) and output (2 B). ``core_attn`` recompute keeps none of these."""
    if options.recomputes("core_attn"):
        return 0.0
    n_local = model.num_attention_heads / shape.tp
    stored = BF16 * shape.tokens * v_dim / shape.tp + FP32 * shape.tokens * n_local
    if options.attention_backend == "unfused":  # estimate_memory resolved "auto" already
        per_score = BF16 + (3 if options.attention_dropout > 0 else 0)
        stored += per_score * shape.mbs * n_local * (shape.seq_len / shape.cp) * shape.seq_len / shape.cp
    del q_dim
    return stored


def gqa_attention_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """GQA/MHA/SWA block: norm + QKV output 2·T·(q·(1+gate) + 2·kv)/tp (Q, K, V saved for the
    attention kernel) + qk-norm inputs 2·T·(q+kv)/tp + core attention + projection input
    (FP8 copy a·T·q/tp when FP8) + dropout mask."""
    h = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.query_groups * model.head_dim
    gate = q if model.attention_output_gate else 0
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * shape.tokens * (q + gate + 2 * kv) / shape.tp
    if model.qk_layernorm:
        stored += BF16 * shape.tokens * (q + kv) / shape.tp
    stored += core_attention_bytes(model, shape, options, q, q)
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * q / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def mla_latent_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """What MLA keeps before its up-projections, plain or absorbed (DSA): the standalone input norm
    (``norm_bytes``) and the down-projection outputs with their norms 2·2·T·(rq + rkv + dr)/sp
    (down projections are not split over TP)."""
    rq, rkv, dr = model.q_lora_rank or 0, model.kv_lora_rank, model.qk_pos_emb_head_dim
    stored = norm_bytes(shape, model.hidden_size, options, standalone=True)
    return stored + 2 * BF16 * shape.tokens * (rq + rkv + dr) / shape.sp


def mla_attention_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """MLA block: norm; down-projection outputs and their norms 2·2·T·(rq + rkv + dr) (down
    projections are not split over TP); Q, K, V after the up-projections and RoPE, saved for the
    attention kernel, 2·T·n·(2·(dn+dr) + dv)/tp — the up-projection outputs themselves are not
    saved (the Linear backward needs its input, the cat/RoPE ops save nothing), and
    ``mla_up_proj`` recompute (output-discarding) drops Q, K, V and replays the up-projections;
    core attention; projection input; dropout mask."""
    h, n = model.hidden_size, model.num_attention_heads
    dn, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    stored = mla_latent_bytes(model, shape, options)
    if not options.recomputes("mla_up_proj"):
        stored += BF16 * shape.tokens * n * (2 * (dn + dr) + dv) / shape.tp
    stored += core_attention_bytes(model, shape, options, n * (dn + dr), n * dv)
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * n * dv / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def dsa_attention_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, indexer: bool
) -> float:
    """DSA block: MLA with matrix absorption (experimental_attention_variant/absorbed_mla.py) and a
    sparse core over the top-k keys (dsa.py ``DSAttention``). Per microbatch, T local tokens:

    - the norm and the down-projection outputs with their norms (``mla_latent_bytes``);
    - the query's no-RoPE part 2·T·n·dn/tp (the einsum with W_UK keeps it) and the absorbed query
      2·T·n·(rkv + dr)/tp, and the latent keys 2·S·(rkv + dr), which every TP rank holds whole
      and context parallelism all-gathers (S = T·cp: DSA supports only ``allgather`` CP, so K
      covers the full sequence); ``mla_up_proj`` recompute drops these three;
    - the sparse core's latent output 2·T·n·rkv/tp and FP32 log-sum-exp 4·T·n/tp (``core_attn``
      recompute drops them), and the up-projected output 2·T·n·dv/tp that linear_proj keeps;
    - an indexer layer's top-k indices, 8·T·k (int64, ``torch.topk``), which the layers sharing
      them read; when the indexer trains (loss coefficient > 0) its saved query 2·T·ni·di,
      gathered keys 2·S·di, FP32 head weights 4·T·ni and k-norm input 2·T·di
      (``FusedDSAIndexerLoss.save_for_backward(q, weights, k, …)``); without the loss the indexer
      runs under no_grad and keeps nothing.

    No measured run checks them: Bridge's GLM-5.2 recipes recompute every layer, where they are one
    layer's transient, and the card's peaks fall on the optimizer step and the logits stage
    (memory_points.csv)."""
    h, n = model.hidden_size, model.num_attention_heads
    dn, dr, dv, rkv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, model.kv_lora_rank
    keys = shape.tokens * shape.cp
    stored = mla_latent_bytes(model, shape, options)
    if not options.recomputes("mla_up_proj"):
        stored += BF16 * shape.tokens * n * (dn + rkv + dr) / shape.tp + BF16 * keys * (rkv + dr)
    if not options.recomputes("core_attn"):
        stored += BF16 * shape.tokens * n * rkv / shape.tp + FP32 * shape.tokens * n / shape.tp
    stored += BF16 * shape.tokens * n * dv / shape.tp
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * n * dv / shape.tp
    if indexer:
        ni, di = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim
        stored += 8 * shape.tokens * model.dsa_indexer_topk
        if model.dsa_indexer_loss_coeff > 0:
            stored += BF16 * shape.tokens * (ni * di + di) + BF16 * keys * di + FP32 * shape.tokens * ni
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


# Chunk length of flash-linear-attention's chunked gated delta rule (``chunk_size=64``, the BT
# of its kernels; fla/ops/gated_delta_rule/chunk.py).
GDN_CHUNK = 64


def gdn_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Gated DeltaNet block, what autograd keeps per microbatch (T local tokens; qk = Hk·dk,
    vd = Hv·dv, nv = Hv value heads, every width over tp).

    Under CP, Megatron turns the in_proj output from sequence- to head-parallel with one
    all-to-all (megatron-core 0.19.2 ssm/gated_delta_net/gdn.py:134-166, ``tensor_a2a_cp2hp``):
    each rank then holds the whole sequence S = T·cp for Hv/(tp·cp) heads, the same element
    count as T tokens of Hv/tp heads, and turns the output back with ``tensor_a2a_hp2cp``
    before out_proj (common.py:332-367, 734). So every term below is T-proportional, whatever cp.

    - the norm fused into in_proj (``norm_bytes``);
    - the (all-to-all'd) in_proj output 2·T·(2qk + 2vd + 2nv)/tp: FLA's ``causal_conv1d``
      saves its input x, a view of that buffer, so the whole buffer stays alive
      (fla/modules/conv/triton/ops.py:392 ``save_for_backward(x, weight, …)``, called with
      ``no_guard_contiguous=["x"]``); the conv output itself is not saved;
    - the L2-normalised q, k and their FP32 norms, 2·T·2qk/tp + 4·T·2Hk/tp (fla l2norm.py:266
      ``save_for_backward(y, rstd)``);
    - what the chunk kernel saves (fla/ops/gated_delta_rule/chunk.py:310
      ``save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A, …)``): q and k
      repeated to the Hv value heads 2·T·2·Hv·dk/tp (gdn.py ``repeat_interleave``), v
      2·T·vd/tp, the FP32 cumulative gate 4·T·Hv/tp, beta 2·T·Hv/tp and the inverted
      intra-chunk matrix A, BF16 [T, Hv, 64], 2·T·Hv·64/tp (chunk_fwd.py
      ``solve_tril(..., output_dtype=k.dtype)``); the gate's input alpha 2·T·Hv/tp (the fused
      softplus saves it);
    - the gated output norm: its input (the kernel output) and its output, kept for the product
      with silu(z), and the z gate, 3·2·T·vd/tp (common.py ``_apply_gated_norm``);
    - out_proj's input a·T·vd/tp; dropout mask.

    The chunk states h of [B, S/64, H, dk, dv] are not saved: the backward recomputes them
    (``gdn_chunk_backward_bytes``). Uncertain: ``_prepare_input_for_gated_delta_rule``,
    ``_compute_g_and_beta`` and ``_apply_gated_norm`` run under ``jit_fuser`` (torch.compile),
    whose partitioner may save a different but similar-sized set than eager autograd does."""
    h = model.hidden_size
    hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    qk, vd = hk * dk, hv * dv
    t, tp = shape.tokens, shape.tp
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * t * (2 * qk + 2 * vd + 2 * hv) / tp  # in_proj output (conv input view)
    stored += BF16 * t * 2 * qk / tp + FP32 * t * 2 * hk / tp  # l2-normalised q, k and rstd
    stored += BF16 * t * (2 * hv * dk + vd) / tp  # q, k repeated to Hv heads; v
    stored += (FP32 + 2 * BF16) * t * hv / tp + BF16 * t * hv * GDN_CHUNK / tp  # g, beta, alpha; A
    stored += 3 * BF16 * t * vd / tp  # gated norm input and output, z gate
    stored += shape.stored_gemm_input * t * vd / tp  # out_proj input
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def gdn_chunk_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one Gated DeltaNet layer runs its backward: FLA's
    ``chunk_gated_delta_rule_bwd`` (fla/ops/gated_delta_rule/chunk.py:126-250, commit bc3b101)
    recomputes the WY factors w, u and the chunk states h, then allocates dh, v_new, dv, dq, dk,
    dw, dk2, dv, db, dg, dg2, all alive until it returns. With T tokens of Hv/tp value heads per
    rank (the whole sequence of Hv/(tp·cp) heads under CP, the same count):

        T·Hv/tp · [2·(5·dk + 4·dv) + 2·2·dk·dv/64 + 2·4 + 2]

    (w, dq, dk, dw, dk2: dk wide; u, v_new, dv, dv: dv wide; h and dh in BF16 per 64-token chunk,
    chunk_delta_h.py ``k.new_empty(B, NT, HV, K, V)``; the FP32 gate grads; db). Qwen3-Next
    (Hv 32, dk = dv = 128) at T = 4096: 437 MB. The forward's transients (w, u, h, v_new) are
    a subset. Uncertain to the few tensors FLA versions add or fuse away."""
    hv = model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    per_head_token = BF16 * (5 * dk + 4 * dv) + 2 * BF16 * dk * dv / GDN_CHUNK + 2 * FP32 + BF16
    return shape.tokens * hv / shape.tp * per_head_token


def mamba_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Mamba-2 mixer: fused norm + in_proj input; the z·x·B·C·dt projection 2·T·(2·d_i + 2·G·N
    + nh)/tp and the scan output before its gate 2·T·d_i/tp, both saved by the fused
    conv1d+scan kernel that training runs (mamba_mixer.py ``_ssm_training`` →
    ``mamba_split_conv1d_scan_combined``, which recomputes the conv and states in backward);
    the gated RMSNorm input 2·T·d_i/tp; out_proj input a·T·d_i/tp; dropout mask."""
    h, d_inner = model.hidden_size, model.mamba_inner_size
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * shape.tokens * (model.mamba_in_proj_size + 2 * d_inner) / shape.tp
    stored += shape.stored_gemm_input * shape.tokens * d_inner / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def dense_mlp_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, ffn: int, tp: int
) -> float:
    """Dense MLP: norm; FC1 output 2·T·ffn·(2 if GLU)/tp; activation output a·T·ffn/tp; dropout
    mask. ``mlp`` recompute keeps only the MLP input."""
    h = model.hidden_size
    if options.recomputes("mlp"):
        return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)
    stored = norm_bytes(shape, h, options, standalone=False)
    glu = 2 if model.gated_linear_unit else 1
    stored += BF16 * shape.tokens * ffn * glu / tp + shape.stored_gemm_input * shape.tokens * ffn / tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def moe_norm_output_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """The MoE block's pre-MLP norm output, as its consumers keep it: the router saves its BF16
    input whatever the precision (moe_utils.py ``RouterGatingLinearFunction``:
    ``save_for_backward(inp, …)``), 2·T·h/sp, and a shared expert's FC1 saves the same tensor in
    BF16 or its own quantized copy a·T·h/sp under FP8 (none when frozen). Selective
    ``layernorm`` recompute of this standalone norm discards the output, and with it what the
    router kept (``moe_norm_recompute_allowed``; under FP8 Megatron makes the shared expert save
    the original input, transformer_layer.py ``set_for_recompute_pre_mlp_layernorm``)."""
    if options.recomputes("layernorm") and moe_norm_recompute_allowed(options):
        return 0.0
    stored = BF16 * shape.tokens * model.hidden_size / shape.sp
    if options.is_fp8 and model.shared_ffn:
        stored += shape.stored_gemm_input * shape.tokens * model.hidden_size / shape.sp
    return stored


def dispatched_tokens(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, static_factor: float = FULL_ITERATION_STASH_FACTOR
) -> float:
    """Tokens one GPU's local experts process: T/sp local tokens × top-k, gathered over ETP, times
    the load-imbalance factor (1 under forced balance). A full-iteration CUDA graph needs static
    shapes, so its buffers are sized for ``static_factor`` × the balanced count when that is
    larger: the paged stash (1.2) for what backward keeps, the rank capacity (1.5) for the
    per-layer dispatch buffers."""
    factor = options.moe_token_imbalance
    if "full_iteration" in options.cuda_graph_scope:
        factor = max(factor, static_factor)
    return shape.tokens / shape.sp * model.moe_router_topk * shape.etp * factor


def moe_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """MoE block: norm input 2·T·h/sp and its output as the router and shared expert keep it
    (``moe_norm_output_bytes``); router logits and probabilities 2·4·(T/sp)·E (FP32 router); per dispatched
    token Td: expert FC1 input a·Td·d_e, FC1 output 2·Td·f·(2 if GLU)/etp, activation output
    a·Td·f/etp (dropped by ``moe_act``); shared expert as a dense MLP; LatentMoE's up-projection
    input a·(T/sp)·d_l (its down-projection reads the norm output, already stored); dropout
    mask. d_e is the width routed tokens carry (h, or the latent size). The router
    probabilities are applied inside the expert activation (experts.py
    ``activation_func_with_probs``), so unpermute saves no Td·d_e copy. ``moe`` recompute keeps
    only the block input."""
    h = model.hidden_size
    if options.recomputes("moe"):
        return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)
    experts = model.num_moe_experts or 0
    stored = BF16 * shape.tokens * h / shape.sp + moe_norm_output_bytes(model, shape, options)
    router_bytes = FP32 if options.moe_router_dtype_fp32 else BF16
    stored += 2 * router_bytes * shape.tokens / shape.sp * experts
    td = dispatched_tokens(model, shape, options)
    f = model.expert_ffn
    glu = 2 if model.gated_linear_unit else 1
    stored += shape.stored_gemm_input * td * model.expert_width + BF16 * td * f * glu / shape.etp
    if model.moe_latent_size:
        stored += shape.stored_gemm_input * shape.tokens / shape.sp * model.moe_latent_size
    if not options.recomputes("moe_act"):
        stored += shape.stored_gemm_input * td * f / shape.etp
    if model.shared_ffn and not options.recomputes("shared_experts"):
        stored += BF16 * shape.tokens * model.shared_ffn * glu / shape.tp
        stored += shape.stored_gemm_input * shape.tokens * model.shared_ffn / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def layer_activation_bytes(
    model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions, *, moe_scale: float = 1.0
) -> float:
    """Stored activations of one transformer layer for one microbatch (no full recompute);
    ``moe_scale`` is the fitted multiplier on the MoE block's tensors."""
    kind = attention_kind(model, layer)
    if kind is AttentionKind.MLA and model.is_dsa:
        attn = dsa_attention_activation_bytes(model, shape, options, indexer=model.has_dsa_indexer(layer))
    elif kind is AttentionKind.MLA:
        attn = mla_attention_activation_bytes(model, shape, options)
    elif kind is AttentionKind.GDN:
        attn = gdn_activation_bytes(model, shape, options)
    elif kind is AttentionKind.MAMBA:
        attn = mamba_activation_bytes(model, shape, options)
    elif kind is AttentionKind.NONE:
        attn = 0.0
    else:
        attn = gqa_attention_activation_bytes(model, shape, options)
    if model.is_moe_layer(layer):
        mlp = moe_scale * moe_activation_bytes(model, shape, options)
    elif model.has_mlp(layer):
        mlp = dense_mlp_activation_bytes(model, shape, options, model.ffn_hidden_size, shape.tp)
    else:
        mlp = 0.0
    if options.is_lora:
        mlp += lora_activation_bytes(model, layer, shape, options)
    offloaded = activation_offload_saving(model, layer, shape, options)
    return max(attn + mlp - offloaded, 0.0)


def lora_activation_bytes(model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions) -> float:
    """What a LoRA layer stores besides the frozen base (whose linears keep no inputs:
    ``token_shape``; Transformer Engine saves a GEMM input only when ``backward_needs_input =
    is_grad_enabled and weight.requires_grad``, module/linear.py, layernorm_linear.py). Each
    adapter's LoRA-A is a Megatron linear that saves its BF16 input for its weight gradient, and
    LoRA-B saves the rank-r LoRA-A output, 2·T·r (2·Td·r for experts):
    - linear_qkv / a dense or shared linear_fc1: the norm output, gathered over TP under sequence
      parallelism, 2·T·h (2·T·h/sp with ``lora_input_regather``, which gathers it again in
      backward; Bridge peft/utils.py ``ParallelLinearAdapter.forward``); a routed expert's fc1
      the dispatched tokens 2·Td·d_e;
    - linear_proj: the attention output 2·T·q/tp, the tensor the attention kernel saves anyway,
      unless core_attn is recomputed or an output gate makes a new one;
    - linear_fc2: the activation output 2·T·ffn/tp (experts 2·Td·f/etp; a ``moe_act`` checkpoint
      frees its storage).
    A shared expert's fc1 adapter saves the norm output the router keeps anyway
    (``moe_norm_output_bytes``) unless it gathers it over TP. Adapters inside a recomputed
    ``mlp``, ``moe`` or ``shared_experts`` block keep nothing."""
    r = options.lora_rank
    t = shape.tokens
    is_moe = model.is_moe_layer(layer)
    td = dispatched_tokens(model, shape, options) if is_moe else 0.0
    gathered = shape.sp if options.lora_input_regather else 1
    stored = 0.0
    for adapter in lora_adapters(model, layer, options.lora_targets):
        if adapter.expert:
            if options.recomputes("moe"):
                continue
            stored += BF16 * td * r
            if adapter.column:
                stored += BF16 * td * adapter.in_features
            elif not options.recomputes("moe_act"):
                stored += BF16 * td * adapter.in_features / shape.etp
            continue
        in_mlp = adapter.target in ("linear_fc1", "linear_fc2")
        if in_mlp and (
            options.recomputes("mlp" if not is_moe else "moe") or (is_moe and options.recomputes("shared_experts"))
        ):
            continue
        stored += BF16 * t * r
        if adapter.target == "linear_proj":
            if options.recomputes("core_attn") or model.attention_output_gate:
                stored += BF16 * t * adapter.in_features / shape.tp
        elif adapter.column:
            # Only the shared expert's fc1 reads the MoE norm output; linear_qkv reads the
            # attention norm's, which nothing else keeps.
            shares_router_input = is_moe and adapter.target == "linear_fc1" and shape.sp == gathered
            if not shares_router_input:
                stored += BF16 * t * adapter.in_features / gathered
        else:
            stored += BF16 * t * adapter.in_features / shape.tp
    return stored


def activation_offload_saving(model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions) -> float:
    """Fine-grained activation offloading (``--offload-modules``) moves a module's saved inputs
    to the host: attn_norm / mlp_norm the norm inputs 2·T·h/sp (standalone norms only: MLA's
    input norm, the MoE pre-MLP norm); qkv_linear the QKV input a·T·h/sp (gone when a
    standalone norm's output is recomputed); core_attn everything core attention saves (Q, K, V,
    output); attn_proj the projection input; expert_fc1 the expert FC1 input a·Td·d_e; moe_act
    the activation output."""
    mods = options.activation_offload_modules
    if not mods:
        return 0.0
    h = model.hidden_size
    saving = 0.0
    kind = attention_kind(model, layer)
    standalone_attn_norm = kind is AttentionKind.MLA
    has_attention = kind.is_softmax_attention
    # Megatron offloads only standalone norms (transformer_layer.py ``offload_attn_norm`` /
    # ``offload_mlp_norm`` require a norm that is not an IdentityOp; see norm_bytes).
    if "attn_norm" in mods and standalone_attn_norm:
        saving += BF16 * shape.tokens * h / shape.sp
    if "mlp_norm" in mods and model.is_moe_layer(layer):
        saving += BF16 * shape.tokens * h / shape.sp
    if "qkv_linear" in mods and has_attention and not (standalone_attn_norm and options.recomputes("layernorm")):
        saving += shape.stored_gemm_input * shape.tokens * h / shape.sp
    if "core_attn" in mods and has_attention:
        q = model.num_attention_heads * model.head_dim
        kv = model.query_groups * model.head_dim
        saving += BF16 * shape.tokens * (q + 2 * kv) / shape.tp
        saving += core_attention_bytes(model, shape, options, q, q)
    if "attn_proj" in mods and options.is_fp8 and has_attention:
        saving += shape.stored_gemm_input * shape.tokens * model.num_attention_heads * model.head_dim / shape.tp
    if model.is_moe_layer(layer) and not options.recomputes("moe"):
        td = dispatched_tokens(model, shape, options)
        if "expert_fc1" in mods:
            saving += shape.stored_gemm_input * td * model.expert_width
        if "moe_act" in mods and not options.recomputes("moe_act"):
            saving += shape.stored_gemm_input * td * model.expert_ffn / shape.etp
    return saving


def mtp_layer_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, moe_scale: float = 1.0
) -> float:
    """An MTP layer: its transformer layer (the last decoder layer's kind, or a hybrid model's
    MTP depth) plus 5·2·T·h/sp: the inputs of the embedding and hidden-state norms (2·T·h/sp
    each), the concatenated 2h input the eh_proj linear saves, and the depth's final norm input
    (multi_token_prediction.py ``_concat_embeddings``, ``_postprocess``)."""
    h = model.hidden_size
    return (
        layer_activation_bytes(model, model.mtp_layer, shape, options, moe_scale=moe_scale)
        + 5 * BF16 * shape.tokens * h / shape.sp
    )


def chunk_layer_bytes(
    model: ModelSpec,
    layers: tuple[int, ...],
    mtp: int,
    shape: TokenShape,
    options: TrainingOptions,
    *,
    moe_scale: float = 1.0,
    known: dict[LayerSignature, float] | None = None,
) -> list[float]:
    """Per-layer stored activations of one model chunk for one microbatch (MTP layers last).
    Identical layers (same signature) are computed once; ``known`` carries them across the chunks
    and stages of one estimate (same model, shape, options and ``moe_scale``)."""
    by_signature = known if known is not None else {}
    per_layer = []
    for layer in layers:
        key = layer_signature(model, layer)
        if key not in by_signature:
            by_signature[key] = layer_activation_bytes(model, layer, shape, options, moe_scale=moe_scale)
        per_layer.append(by_signature[key])
    if mtp:
        per_layer += [mtp_layer_activation_bytes(model, shape, options, moe_scale=moe_scale)] * mtp
    return per_layer


def full_recompute_bytes(per_layer: list[float], shape: TokenShape, h: int, options: TrainingOptions) -> float:
    """Full recompute: uniform keeps each group of N layers' input 2·T·h/sp; block recomputes the
    first N layers of the chunk (input only) and stores the rest in full (transformer_block.py
    ``_checkpointed_forward``). The recomputed group's live activations count as a transient."""
    checkpoint = BF16 * shape.tokens * h / shape.sp
    n = max(options.recompute_num_layers, 1)
    if options.recompute_method == "block":
        recomputed = min(n, len(per_layer))
        return recomputed * checkpoint + sum(per_layer[recomputed:])
    groups = -(-len(per_layer) // n)
    return groups * checkpoint


def embedding_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """First stage: embedding output 2·T·h/sp (+ dropout mask)."""
    h = model.hidden_size
    return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)


def logits_loss_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions, heads: int) -> float:
    """Loss stage, per microbatch: final norm 2·2·T·h/sp, plus (4·H + 2)·T·V/tp for H output heads
    (the main head and each MTP depth, computed one after the other, each keeping what its
    backward needs). Megatron's unfused and fused kernels cast each head's BF16 logits to FP32
    (``logits.float()``), turn that buffer into the softmax in place and save it for backward
    (tensor_parallel/cross_entropy.py ``calculate_logits_max``; fusions/fused_cross_entropy.py
    ``save_for_backward(exp_logits, …)``; torch.compile keeps those steps in place, the saved
    softmax being the cast buffer itself: tests/test_megatron_validation.py): 4 B per head, plus
    the current head's 2 B BF16 logits while it is cast (and its 2 B BF16 gradient in backward).
    With one head that is the 6 B every golden run shows. Transformer Engine's kernel
    (``cross_entropy_fusion_impl=te``, Bridge's perf-recipe default) saves only the BF16 logits in
    its source (transformer_engine/pytorch/cross_entropy.py ``save_for_backward(_input)``), yet the five
    measured Nemotron-3.5 Lightning runs that use it (three heads, memory_points.csv) peak within
    2% of where 4 B per head puts them and 2 B per head would leave them 9–14% short, so every
    kernel is modelled at 4·H + 2."""
    vocab = model.padded_vocab_size(shape.tp)
    per_token_vocab = FP32 * heads + BF16
    norm = 2 * BF16 * shape.tokens * model.hidden_size / shape.sp
    return norm + per_token_vocab * shape.tokens * vocab / shape.tp


def moe_dispatch_transient_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Live only while one MoE layer runs: the permuted send buffer and the received tokens,
    2·2·Td·d_e (alltoall/flex); the allgather dispatcher gathers every TP·EP rank's tokens,
    2·(T/sp)·tp·ep·d_e, before selecting its own (d_e: ``ModelSpec.expert_width``)."""
    if not model.is_moe:
        return 0.0
    d_e = model.expert_width
    td = dispatched_tokens(model, shape, options, static_factor=FULL_ITERATION_RANK_CAPACITY)
    if options.dispatcher == "allgather":
        return BF16 * shape.tokens / shape.sp * shape.tp * shape.ep * d_e + 2 * BF16 * td * d_e
    return 2 * BF16 * td * d_e


# Megatron's cuDNN DSA path bounds its scratch (experimental_attention_variant/dsa_cudnn_kernels.py
# _INDEXER_SCORE_CHUNK_MAX_BYTES, _TOPK_WRAPPER_MAX_SCRATCH_BYTES).
DSA_SCORE_CHUNK_BYTES = 1024.0**3
DSA_TOPK_SCRATCH_BYTES = 2 * 1024.0**3


def dsa_kernel_scratch_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while an indexer layer runs (Bridge's GLM-5.2 recipes pick the cuDNN DSA
    kernels, ``dsa_kernel_backend="cudnn"``): the FP32 index scores of a chunk of query rows over
    every key, min(4·T·S, 1 GiB), and the top-k wrapper's two int32 words per score, min(8·T·S,
    2 GiB) (dsa_cudnn_kernels.py ``_indexer_score_chunk_rows``, ``_indexer_top_k_wrapper_chunked``);
    T local queries, S = T·cp all-gathered keys. GLM-5.2 at 200K over CP 32: 1 + 2 GiB."""
    if not model.is_dsa:
        return 0.0
    pairs = shape.tokens * shape.tokens * shape.cp
    return min(FP32 * pairs, DSA_SCORE_CHUNK_BYTES) + min(2 * 4 * pairs, DSA_TOPK_SCRATCH_BYTES)


# FlashMLA's sparse kernels run 64 query heads at least (dsa_cudnn_kernels.py
# ``_flash_mla_head_padding``: fewer local heads are zero-padded to 64 on Hopper).
FLASH_MLA_MIN_HEADS = 64


def dsa_sparse_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one DSA layer's sparse attention runs its backward (every DSA layer,
    index-sharing ones too): megatron-core 0.19.2 experimental_attention_variant/
    dsa_cudnn_kernels.py ``FusedSparseAttentionFunc.backward`` → ``_run_sparse_attention_backward``
    (:1996-2097), the cuDNN path Bridge's GLM-5.2 recipes select (``dsa_kernel_backend="cudnn"``).
    It appends a zero row to the absorbed query, the latent output, its gradient, the LSE and
    the top-k indices (``torch.cat``, :2070-2075), gathers the rows that have keys
    (``index_select(...).contiguous()``, :2077-2089), runs the kernel, which returns dq and the
    gradient of the gathered latent keys, and scatters dq into a zeroed full-size tensor
    (:2091). With T local queries, n' = max(n/tp, 64) heads as the kernel pads them, d_q = rkv + dr,
    d_v = rkv, k top-k and S = T·cp all-gathered keys:

        2·(2·T·n'·(d_q + 2·d_v) + 4·T·n' + 4·T·k)    two copies of q, out, dO, LSE, indices
      + 2·2·T·n'·d_q                                  dq and its scattered copy
      + 4·S·d_q                                       dkv over every gathered key

    GLM-5.2 at 200K over CP 32 (T = 6250, 64 heads): 3.8 GiB. Uncertain: the dtype of the
    kernel's dkv (taken as FP32 accumulation) and whether cuDNN allocates its own workspace."""
    if not model.is_dsa:
        return 0.0
    t, keys = shape.tokens, shape.tokens * shape.cp
    heads = max(model.num_attention_heads / shape.tp, FLASH_MLA_MIN_HEADS)
    d_q = model.kv_lora_rank + model.qk_pos_emb_head_dim
    d_v = model.kv_lora_rank
    copies = 2 * (BF16 * t * heads * (d_q + 2 * d_v) + FP32 * t * heads + 4 * t * model.dsa_indexer_topk)
    return copies + 2 * BF16 * t * heads * d_q + FP32 * keys * d_q


def mamba_scan_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one Mamba-2 mixer runs its backward: the fused kernel Megatron trains
    with (megatron-core 0.19.2 ssm/mamba_mixer.py:727-781 ``mamba_split_conv1d_scan_combined``)
    saves only its input and the scan output, and its backward (state-spaces/mamba@e9594ce
    mamba_ssm/ops/triton/ssd_combined.py:903-990 ``MambaSplitConv1dScanCombinedFn.backward``,
    :397-470 ``_mamba_chunk_scan_combined_bwd``) rebuilds the conv output x·B·C, allocates the
    in_proj-wide gradient dzxbcdt and dxBC, recomputes CB and the chunk states in FP32, and
    makes the state gradients, both cast to the BF16 state dtype (Megatron's default
    ``mamba_training_ssm_states_dtype`` = params dtype). With T local tokens (Megatron's Mamba CP
    is an all-to-all to head-parallel, mamba_context_parallel.py, so T·cp tokens of 1/cp of the
    heads), d_i, G, nh over tp, N the state size and cs the chunk length:

        (4 + 4 + 2 + 2)·T·d_i·N/cs        states and dstates, FP32 and BF16
      + 4·T·G·cs                          CB
      + 2·2·T·(d_i + 2·G·N)               recomputed x·B·C and its gradient
      + 2·T·(2·d_i + 2·G·N + nh)          dzxbcdt
      + 2·T·d_i + 3·4·T·nh                the output-gradient copy; dA_cumsum, dt, ddA (FP32)

    Nemotron-3 Nano (64 heads of 64, N 128, 8 groups, chunk 128) at T = 8192: 0.8 GiB.
    Uncertain to the few [T, nh]-sized FP32 buffers the Triton kernels add."""
    if not model.mamba_num_heads:
        return 0.0
    tp, t = shape.tp, shape.tokens
    d_i = model.mamba_inner_size / tp
    groups, state, heads = model.mamba_num_groups / tp, model.mamba_state_dim, model.mamba_num_heads / tp
    chunk = model.mamba_chunk_size
    xbc = d_i + 2 * groups * state
    scratch = (2 * FP32 + 2 * BF16) * t * d_i * state / chunk + FP32 * t * groups * chunk
    scratch += 2 * BF16 * t * xbc + BF16 * t * (d_i + xbc + heads) + BF16 * t * d_i + 3 * FP32 * t * heads
    return scratch


def cp_p2p_attention_forward_bytes(model: ModelSpec, layer: int, shape: TokenShape) -> float:
    """Live only while one softmax-attention layer (GQA, sliding window, plain MLA) runs its
    forward under ring (``p2p``) context parallelism: Transformer Engine's
    ``AttnFuncWithCPAndKVP2P.forward`` allocates a new K/V receive buffer at every one of the cp
    steps (``p2p_comm_buffers[i + 1] = torch.empty_like(p2p_comm_buffers[i])``) and keeps every
    step's output and LSE (``out_per_step``, ``softmax_lse_per_step``) for the output correction
    after the loop; none is released before the function returns
    (TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py:1672-1717, 1979-2087). On the last CP rank of the causal load-balanced
    split every step computes all T local query rows, so with S = T·cp, n = heads/tp,
    n_kv = K/V heads/tp (MLA: n), dk, dv the K and V head widths:

        2·S·n_kv·(dk + dv) + 2·S·n·dv + 4·S·n + 4·T·n·dv

    (K/V ring buffers, per-step outputs and LSEs, the FP32 corrected output). The backward keeps
    two ping-pong K/V(+dK/dV) buffers only, so this is a forward moment. ``a2a`` CP trades
    heads for sequence (T·cp tokens of n/cp heads) and DSA all-gathers latent keys instead
    (``dsa_sparse_backward_bytes``), so neither has it; ``a2a+p2p`` is not modelled (lcmoe does
    not know the a2a group size). Not applied to the estimate (``stage_mixer_transients``):
    the DeepSeek-V3 long-context layouts NVIDIA ran at CP 16-64 would then be predicted out of
    memory by 5-15%, so either this or another term of those estimates is off, and no measured
    long-context peak tells which."""
    kind = attention_kind(model, layer)
    if shape.cp <= 1 or shape.cp_comm_type != "p2p" or not kind.is_softmax_attention or model.is_dsa:
        return 0.0
    n = model.num_attention_heads / shape.tp
    if kind is AttentionKind.MLA:
        n_kv, dk, dv = n, model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    else:
        n_kv, dk, dv = model.query_groups / shape.tp, model.head_dim, model.head_dim
    t, s = shape.tokens, shape.tokens * shape.cp
    return BF16 * s * n_kv * (dk + dv) + BF16 * s * n * dv + FP32 * s * n + FP32 * t * n * dv


def stage_mixer_transients(
    model: ModelSpec, stage: PipelineStage, shape: TokenShape, options: TrainingOptions
) -> tuple[float, float]:
    """(forward, backward) working sets of the stage's sequence mixers beyond their stored
    tensors, the largest over the stage's layer kinds: the DSA indexer's score and top-k
    scratch (``dsa_kernel_scratch_bytes``, in the forward, replayed in the backward under
    recompute), the DSA sparse-attention backward (``dsa_sparse_backward_bytes``), the
    Gated DeltaNet chunk backward (``gdn_chunk_backward_bytes``) and the Mamba-2 scan backward
    (``mamba_scan_backward_bytes``). The TE ring-CP forward
    (``cp_p2p_attention_forward_bytes``) is left out until a measurement settles it."""
    del options
    if not (model.is_dsa or model.linear_attention_type or model.mamba_num_heads):
        return 0.0, 0.0  # the planner's hot path: most models hold none of these mixers
    firsts = [first for first, count in stage.layer_groups if count]
    if stage.mtp_layers:
        firsts.append(model.mtp_layer)
    kinds = {attention_kind(model, layer) for layer in firsts}
    forward = backward = 0.0
    if model.is_dsa and AttentionKind.MLA in kinds:
        if any(model.has_dsa_indexer(layer) for layer in firsts):
            forward = dsa_kernel_scratch_bytes(model, shape)
        backward = dsa_sparse_backward_bytes(model, shape)
    if AttentionKind.GDN in kinds:
        backward = max(backward, gdn_chunk_backward_bytes(model, shape))
    if AttentionKind.MAMBA in kinds:
        backward = max(backward, mamba_scan_backward_bytes(model, shape))
    return forward, backward


def te_workspace_bytes(model: ModelSpec, options: TrainingOptions, architecture: str) -> float:
    """cuBLAS(Lt) workspaces Transformer Engine allocates through PyTorch: one of 32 MiB on
    Hopper and later (4 MiB before), plus four more for the multi-stream grouped GEMM of MoE
    experts (transformer_engine/pytorch/module/base.py ``get_workspace``,
    ``get_multi_stream_cublas_workspace``)."""
    per_stream = (32 if architecture in ("hopper", "blackwell") else 4) * 1024.0**2
    streams = 1 + (4 if model.is_moe and options.moe_grouped_gemm else 0)
    return per_stream * streams


def replayed_options(options: TrainingOptions) -> TrainingOptions:
    """The options a layer's backward runs under: selectively recomputed modules are
    rematerialised for it (the checkpoint replays their forward), so its working set is the
    layer without selective recompute (``estimate_memory`` builds them once for its stages)."""
    if options.recompute_granularity != "selective":
        return options
    return replace(options, recompute_granularity="none", recompute_modules=frozenset())


# ----- assembling a stage ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of the worst GPU of one pipeline stage, by component (bytes)."""

    stage: int
    layers: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits_loss: float
    transient: float
    workspace: float
    peak_allocated: float
    fragmentation: float
    cuda_context: float
    nccl_buffers: float
    cuda_graphs: float
    dispatcher_buffers: float
    peak_reserved: float
    optimizer_host: float
    inflight_microbatches: int
    # What is live at the peak moment (components() sums exactly to peak_reserved): the loss
    # stage peaks on the logits or on a layer's backward, not both; in first-step mode the Adam
    # moments are not allocated yet during the first backward; DDP/optimizer padding is its own
    # "state_overhead" term.
    state_overhead: float = 0.0
    weight_copies: float = 0.0
    optimizer_at_peak: float | None = None
    activations_at_peak: float | None = None
    logits_at_peak: float | None = None
    transient_at_peak: float | None = None

    def components(self) -> dict[str, float]:
        """Bytes by component at the stage's peak; the values sum to ``peak_reserved``."""

        def at_peak(value: float | None, default: float) -> float:
            return default if value is None else value

        return {
            "weights": self.weights,
            "weight_copies": self.weight_copies,
            "gradients": self.gradients,
            "optimizer": at_peak(self.optimizer_at_peak, self.optimizer),
            "state_overhead": self.state_overhead,
            "activations": at_peak(self.activations_at_peak, self.activations),
            "logits_loss": at_peak(self.logits_at_peak, self.logits_loss),
            "transient": at_peak(self.transient_at_peak, self.transient),
            "workspace": self.workspace,
            "fragmentation": self.fragmentation,
            "cuda_context": self.cuda_context,
            "nccl_buffers": self.nccl_buffers,
            "cuda_graphs": self.cuda_graphs,
            "dispatcher_buffers": self.dispatcher_buffers,
        }


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    stages: tuple[StageMemory, ...]
    capacity_bytes: float
    host_capacity_bytes: float
    error_band: float = 0.0

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak_reserved)

    @property
    def peak_allocated_bytes(self) -> float:
        return max(s.peak_allocated for s in self.stages)

    @property
    def peak_reserved_bytes(self) -> float:
        return max(s.peak_reserved for s in self.stages)

    @property
    def peak_torch_reserved_bytes(self) -> float:
        """What ``torch.cuda.max_memory_reserved`` (Bridge's ``mem-max-reserved``) reports: the
        caching allocator's segments, allocated plus fragmentation. The CUDA context, NCCL and
        DeepEP/HybridEP buffers are allocated outside PyTorch and appear only in nvidia-smi."""
        return max(s.peak_allocated + s.fragmentation for s in self.stages)

    @property
    def host_bytes_per_gpu(self) -> float:
        return max(s.optimizer_host for s in self.stages)

    def fits(self, margin: float = 0.0) -> bool:
        """Reserved peak of every stage within (1 − margin) of the GPU's memory, host within its DRAM."""
        return (
            self.peak_reserved_bytes <= (1.0 - margin) * self.capacity_bytes
            and self.host_bytes_per_gpu <= self.host_capacity_bytes
        )

    @property
    def oom_risk(self) -> bool:
        """Predicted to fit, but by less than the estimator's own error: the reserved peak raised by
        ``error_band`` (the held-out 90th-percentile error) would not fit. Such a verdict cannot
        be trusted either way; every documented OOM that lcmoe predicts to fit within 5% of
        capacity in memory_points.csv is one (benchmarks/memory_accuracy.py)."""
        return self.fits() and self.peak_reserved_bytes * (1.0 + self.error_band) > self.capacity_bytes

    def as_dict(self) -> dict[str, object]:
        worst = self.worst
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_torch_reserved_bytes": self.peak_torch_reserved_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.capacity_bytes - self.peak_reserved_bytes,
            "fits": self.fits(),
            "oom_risk": self.oom_risk,
            "error_band_pct": 100 * self.error_band,
            "worst_stage": worst.stage,
            "host_bytes_per_gpu": self.host_bytes_per_gpu,
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "inflight_microbatches": s.inflight_microbatches,
                    "peak_allocated_bytes": s.peak_allocated,
                    "peak_reserved_bytes": s.peak_reserved,
                    "components": s.components(),
                }
                for s in self.stages
            ],
        }


def stage_memory(
    model: ModelSpec,
    layout: ParallelLayout,
    options: TrainingOptions,
    stage: PipelineStage,
    coefficients: MemoryCoefficients,
    *,
    first_step: bool = False,
    architecture: str = "hopper",
    nvlink_domain: int = 8,
    known: tuple[dict[LayerSignature, float], dict[LayerSignature, float]] | None = None,
    params: StageParams | None = None,
    replayed: TrainingOptions | None = None,
) -> StageMemory:
    """Peak of one stage: the larger of two moments (``known``: per-layer activations already
    computed for this model, layout and options, and for their recompute-free replay, shared by
    ``estimate_memory``'s stages; ``params``: the stage's parameters per GPU, ``StagedLayout``;
    ``replayed``: ``replayed_options(options)``).

    Forward/backward: model state + in-flight activations + loss buffers + transients.
    Optimizer step: model state + the FP32 gradient copies ``optimizer_grad_copy_bytes``
    (+ the forward/backward working set a full-iteration graph keeps pinned in its pool).
    Steady state (default): the optimizer moments are resident during forward/backward. With
    ``first_step`` the peak is that of the first iteration, whose forward/backward runs before
    the moments exist and eagerly (no graph pool yet).
    """
    c = coefficients
    known = known or ({}, {})
    shape = token_shape(layout, options)
    trained, state = stage_state_bytes(model, layout, stage, options, architecture, params)
    h = model.hidden_size

    inflight = inflight_microbatch_chunks(layout, stage.rank)
    chunk_bytes: list[float] = []
    # The allgather dispatcher keeps gathered copies of every TP·EP rank's tokens that the
    # per-tensor physics does not list; their size is fitted (allgather_moe_scale).
    moe_scale = c.allgather_moe_scale if options.dispatcher == "allgather" else 1.0
    replayed = replayed or replayed_options(options)
    # Under selective recompute a layer's backward works on what the replay rematerialises, so
    # the largest working set is the largest layer without it: one layer per signature suffices.
    largest_layer = 0.0
    if replayed is not options:
        representatives = tuple(first for first, _ in stage.layer_groups)
        full_layers = chunk_layer_bytes(
            model, representatives, min(stage.mtp_layers, 1), shape, replayed, moe_scale=moe_scale, known=known[1]
        )
        largest_layer = max(full_layers, default=0.0)
    for chunk in stage.chunks:
        per_layer = chunk_layer_bytes(
            model, chunk.decoder_layers, chunk.mtp_layers, shape, options, moe_scale=moe_scale, known=known[0]
        )
        largest_layer = max([largest_layer, *per_layer])
        if options.recompute_granularity == "full":
            stored = full_recompute_bytes(per_layer, shape, h, options)
            largest_layer = max(largest_layer, sum(sorted(per_layer)[-options.recompute_num_layers :]))
        else:
            stored = sum(per_layer)
        if chunk.embedding:
            stored += embedding_activation_bytes(model, shape, options)
        chunk_bytes.append(stored)
    mean_chunk = sum(chunk_bytes) / max(len(chunk_bytes), 1)
    activations = (
        c.activation_scale * mean_chunk * inflight
        if layout.vpp > 1
        else c.activation_scale * (chunk_bytes[0] * inflight)
    )

    logits = 0.0
    if stage.has_loss:
        logits = c.logits_scale * logits_loss_bytes(model, shape, options, 1 + stage.mtp_layers)
    moe_layers = stage_holds(model, stage, model.is_moe_layer)
    dispatch = c.moe_dispatch_scale * moe_dispatch_transient_bytes(model, shape, options) if moe_layers else 0.0
    # A mixer's kernel scratch (forward, replayed under recompute) and its backward working set
    # come one after the other inside the layer's backward: the larger of the two counts.
    forward_scratch, backward_scratch = stage_mixer_transients(model, stage, shape, options)
    transient = c.transient_layer_scale * largest_layer + dispatch + max(forward_scratch, backward_scratch)
    workspace = c.workspace_bytes + te_workspace_bytes(model, options, architecture)

    # DDP/optimizer buffers are padded and bucketed; the fitted fraction covers that bookkeeping.
    overhead = state.buffered * c.state_overhead_fraction
    static = state.weights + state.gradients + state.optimizer + overhead
    moments = state.optimizer_moments * (1.0 + c.state_overhead_fraction)
    # The loss stage peaks while the logits buffers are live (no layer is in backward then);
    # every other moment of every stage peaks in a layer's backward (its working set plus the
    # MoE dispatch buffers). Both sit on top of the stored activations.
    dynamic = activations + max(logits, transient)
    graphs = cuda_graph_pool_bytes(model, shape, options, stage, inflight)
    persistent = static + state.weight_copies + workspace + graphs
    # The optimizer step runs after the activations are freed, except that a captured
    # full-iteration graph keeps its whole working set in its private pool between replays
    # (the pool is only released when the graph is destroyed; the first step runs eagerly).
    pinned = dynamic if "full_iteration" in options.cuda_graph_scope and not first_step else 0.0
    grad_copies = optimizer_grad_copy_bytes(trained, layout, options)
    forward_backward = persistent - moments + dynamic if first_step else persistent + dynamic
    optimizer_step = persistent + pinned + grad_copies
    peak_allocated = max(forward_backward, optimizer_step)
    optimizer_live = state.optimizer
    logits_live, transient_live = (logits, 0.0) if logits >= transient else (0.0, transient)
    activations_live = activations
    if optimizer_step > forward_backward:  # peak in the optimizer step: the copies are the transient
        if not pinned:
            activations_live = logits_live = transient_live = 0.0
        transient_live += grad_copies
    elif first_step:  # peak in the first backward, before the moments exist
        optimizer_live -= state.optimizer_moments
        overhead -= state.optimizer_moments * c.state_overhead_fraction

    fraction = c.fragmentation_fraction if options.expandable_segments else c.fragmentation_fraction_no_expandable
    fragmentation = fraction * peak_allocated
    dispatcher = dispatcher_buffer_bytes(model, shape, options, nvlink_domain=nvlink_domain)
    reserved = peak_allocated + fragmentation + c.cuda_context_bytes + c.nccl_buffer_bytes + dispatcher
    return StageMemory(
        stage=stage.rank,
        layers=len(stage.decoder_layers) + stage.mtp_layers,
        weights=state.weights,
        gradients=state.gradients,
        optimizer=state.optimizer,
        activations=activations,
        logits_loss=logits,
        transient=transient,
        workspace=workspace,
        peak_allocated=peak_allocated,
        fragmentation=fragmentation,
        cuda_context=c.cuda_context_bytes,
        nccl_buffers=c.nccl_buffer_bytes,
        cuda_graphs=graphs,
        dispatcher_buffers=dispatcher,
        peak_reserved=reserved,
        optimizer_host=state.optimizer_host,
        inflight_microbatches=inflight,
        state_overhead=overhead,
        weight_copies=state.weight_copies,
        optimizer_at_peak=optimizer_live,
        activations_at_peak=activations_live,
        logits_at_peak=logits_live,
        transient_at_peak=transient_live,
    )


def stage_holds(model: ModelSpec, stage: PipelineStage, holds: Callable[[int], bool]) -> bool:
    """Whether a decoder or MTP layer of the stage satisfies ``holds``, a property of the layer
    signature (MoE, DSA indexer): one layer per signature group is asked."""
    return any(holds(first) for first, _ in stage.layer_groups) or bool(stage.mtp_layers and holds(model.mtp_layer))


def cuda_graph_pool_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, stage: PipelineStage, inflight: int
) -> float:
    """CUDA-graph memory the caching allocator cannot share with eager tensors (allocated).

    TE-scoped graphs (``cuda_graph_impl=transformer_engine``): Megatron gives each (layer,
    microbatch) graph a static input that is reused once that microbatch's backward is done,
    and from TE 2.7 make_graphed_callables also reuses the static input/output buffers between
    graphs, one graph's output being the next one's input (megatron/core/transformer/
    cuda_graphs.py:2322-2345 ``_get_sample_arguments``, :2684-2686
    ``_reuse_graph_input_output_buffers``). Those inputs are the block inputs autograd saves
    anyway (``norm_bytes``), and what a graph saves for backward lives in the shared graph pool
    in place of the eager copy, so what is left is one input and one output buffer of 2·T·h/sp
    per in-flight microbatch while a graph chain runs: 2·(2·T·h/sp)·inflight, when the stage
    holds a graphed module. Measured runs are consistent with that: Nemotron-3.5 Lightning on
    8 GB200 at MBS 2 peaks at 156.85 GiB allocated with attn, mamba, moe_router and
    moe_preprocess graphed (perf recipe) and at 158.22 GiB without graphs (convergence recipe,
    natural routing), where one buffer pair per graphed module and layer would add 13 GiB
    (memory_points.csv).

    A full-iteration graph captures forward and backward of every microbatch into one private
    pool that is reused during capture as the eager allocator would be (torch.cuda.graph empties
    the eager cache before capture; Bridge sets ``graph_capture_record_stream_reuse:True`` so
    side-stream frees are reused too), so it adds no term here: its cost is the static MoE token
    budget (``dispatched_tokens``) and its working set staying pinned through the optimizer
    step (``stage_memory``).
    """
    scope = options.cuda_graph_scope
    if not scope or "full_iteration" in scope:
        return 0.0
    groups = [*stage.layer_groups, (model.mtp_layer, stage.mtp_layers)]
    if not any(count and graphed_modules(model, first, scope) for first, count in groups):
        return 0.0
    return 2 * BF16 * shape.tokens * model.hidden_size / shape.sp * inflight


def graphed_modules(model: ModelSpec, layer: int, scope: frozenset[str]) -> int:
    """How many of the scope's modules a layer holds: ``attn`` any attention, ``mamba`` a Mamba
    mixer, ``mlp`` a dense MLP, ``moe`` / ``moe_router`` / ``moe_preprocess`` a MoE block
    (transformer_config.py cuda_graph_scope; a hybrid model's layer holds one block)."""
    kind = attention_kind(model, layer)
    holds = {
        "attn": kind not in (AttentionKind.MAMBA, AttentionKind.NONE),
        "mamba": kind is AttentionKind.MAMBA,
        "mlp": model.has_mlp(layer) and not model.is_moe_layer(layer),
    }
    moe = model.is_moe_layer(layer)
    return sum(holds.get(name, moe) for name in scope)


def dispatcher_buffer_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, nvlink_domain: int = 8
) -> float:
    """DeepEP / HybridEP register their NVLink (and RDMA) buffers with cudaMalloc / cuMem outside
    the PyTorch allocator, so they appear in reserved (nvidia-smi) memory only. DeepEP: ≈1 GiB
    NVL buffer, plus ≈1 GiB RDMA buffer when the EP group leaves the NVLink domain (DeepEP
    defaults; facts §6.13). HybridEP: ``hybridep_buffer_bytes``."""
    if not model.is_moe or options.dispatcher not in ("deepep", "hybridep"):
        return 0.0
    if options.dispatcher == "hybridep":
        return hybridep_buffer_bytes(model, shape, nvlink_domain=nvlink_domain)
    return 1024.0**3 * (2.0 if shape.ep * shape.etp > 8 else 1.0)


def hybridep_buffer_bytes(model: ModelSpec, shape: TokenShape, *, nvlink_domain: int = 8) -> float:
    """HybridEP's buffers, sized once for the worst case of every token of the EP group landing on
    one rank (DeepEP hybrid-ep ``HybridEPBuffer::allocate_buffer``; csrc/hybrid_ep/hybrid_ep.cu,
    buffer/intranode.cu ``allocate_dispatch_buffers`` / ``allocate_combine_buffers``).

    Tᵣ = tokens one rank dispatches (Megatron passes the first input's row count, T/sp:
    fused_a2a.py ``init_hybrid_ep_buffer``); the group of g = ep·etp ranks spans R = min(D, g)
    ranks per NVLink domain of D GPUs and N = g/R domains (deep_ep/hybrid_ep_buffer.py reads D
    from ``NVLINK_DOMAIN_SIZE``, which Bridge sets to the system's domain: 8 on HGX, 72 on
    NVL72); Eᵣ local experts; d the dispatched width. M = Tᵣ·R·N tokens:

        M·(2·d + 4·R·Eᵣ + 4·d/128)     BF16 tokens (Megatron never dispatches FP8,
                                        fused_a2a.py), FP32 probabilities, FP32 scales

    shared by dispatch and combine inside one domain; across domains dispatch keeps its own
    token and probability buffers, and three RDMA staging buffers of Tᵣ·(N − 1) tokens are
    added. Example: DeepSeek-V3 at 4K tokens per rank, EP64 on NVL72: M = 4096·64 = 262 144,
    262 144·(2·7168 + 4·256 + 224) B = 3.8 GiB; Qwen3-30B-A3B at MBS 4, EP8: 0.6 GiB."""
    group = shape.ep * shape.etp
    ranks = min(nvlink_domain, group)
    domains = max(group // ranks, 1)
    local_experts = (model.num_moe_experts or 0) / shape.ep
    width = model.expert_width
    tokens = shape.tokens / shape.sp
    per_token = BF16 * width + FP32 * ranks * local_experts
    worst = tokens * ranks * domains
    buffers = worst * (per_token + FP32 * width / 128)
    if domains > 1:
        buffers += worst * per_token + 3 * tokens * (domains - 1) * per_token
    return buffers


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


def estimate_memory(
    model: ModelSpec,
    hardware: HardwareSpec | None,
    layout: ParallelLayout,
    options: TrainingOptions,
    coefficients: MemoryCoefficients | None = None,
    *,
    first_step: bool = False,
    staged: StagedLayout | None = None,
) -> MemoryEstimate:
    """Peak memory of every pipeline stage (worst GPU of each); see ``stage_memory``.
    ``staged`` (``staged_layout`` of this model and layout) may be passed when the caller already
    has it (the planner does)."""
    coeffs = coefficients or shipped_coefficients()
    architecture = hardware.architecture if hardware else "hopper"
    nvlink_domain = hardware.nvlink_domain_size if hardware else 8
    # Only the unfused kernel stores differently (flash and fused keep the same tensors), so the
    # options are copied only then, not on every estimate of the planner's hot path.
    if options.attention_backend != "unfused" and attention_kernel(options, architecture) == "unfused":
        options = replace(options, attention_backend="unfused")
    staged = staged or staged_layout(model, layout)
    known: tuple[dict[LayerSignature, float], dict[LayerSignature, float]] = ({}, {})
    replayed = replayed_options(options)
    stages_memory = tuple(
        stage_memory(
            model,
            layout,
            options,
            stage,
            coeffs,
            first_step=first_step,
            architecture=architecture,
            nvlink_domain=nvlink_domain,
            known=known,
            params=params,
            replayed=replayed,
        )
        for stage, params in zip(staged.stages, staged.params, strict=True)
    )
    capacity = hardware.hbm_bytes if hardware else float("inf")
    host = hardware.host_memory_bytes if hardware else float("inf")
    return MemoryEstimate(stages_memory, capacity, host, coeffs.error_band)
