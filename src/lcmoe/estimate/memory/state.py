"""Model state on one GPU: parameters per stage, weights, gradients, optimizer state and its
shards."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.fsdp import shards_grads, shards_params, unit_buffer_bytes
from lcmoe.estimate.memory.constants import (
    BF16,
    FP32,
    MXFP8_SCALE_BLOCK,
    NVFP4_BYTES,
    NVFP4_SCALE_BLOCK,
)
from lcmoe.estimate.params import (
    layer_params,
    lora_adapters,
    mtp_extra_params,
)
from lcmoe.layout import ParallelLayout, PipelineStage, pipeline_stages
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


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
        return NVFP4_BYTES + 1 / NVFP4_SCALE_BLOCK
    if options.precision in ("mxfp8", "fp8-blockwise"):
        return 1.0 + 1 / MXFP8_SCALE_BLOCK
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


def scalar_optimizer_bytes_per_param(options: TrainingOptions) -> float:
    """Under Muon, the bytes of a parameter Muon leaves to its scalar optimizer (Adam: master +
    two moments): the embedding and output layer (emerging_optimizers.py:128-130, :805-809;
    ``estimate.muon``); the norms and biases it also leaves are a rounding error here, like
    ``StageParams.linear``'s. Otherwise ``optimizer_bytes_per_param``."""
    if options.optimizer != "muon":
        return optimizer_bytes_per_param(options)
    moment = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0}[options.exp_avg_dtype]
    return master_param_bytes(options) + 2 * moment


def optimizer_shards(layout: ParallelLayout, options: TrainingOptions) -> tuple[int, int]:
    """(dense, expert) shard counts of the distributed optimizer: dense over DP·CP, experts over
    EDP, each divided by the number of optimizer instances (facts §5.2; distrib_optimizer.py)."""
    if not options.distributed_optimizer and not options.megatron_fsdp:
        return 1, 1
    if options.megatron_fsdp and options.megatron_fsdp_sharding == "no_shard":
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
    unit_params: float = 0.0,
) -> ModelState:
    """weights = P_linear·w + P_vocab·2 (quantized parameters are the TE linear weights only: the
    embedding and output layer stay BF16); grads = P·g; optimizer = P_dense·o/shard_dense +
    P_expert·o/shard_expert, times (1 − offload fraction) on the GPU and the rest on the host;
    weight copies = P_linear·``quantized_weight_copy_bytes``. Megatron-FSDP also shards the
    gradients (``optim_grads``) and the weights (``optim_grads_params``) over the same groups, and
    then holds ``unit_params`` (one layer on the rank) gathered twice over, weights and gradients
    (``estimate.fsdp.unit_buffer_bytes``). With ``trainable`` (LoRA adapters,
    ``stage_lora_params_per_gpu``) the base is frozen: Megatron's DDP buffers and the optimizer
    cover only parameters that require grad, so grads and optimizer count the adapters, whose
    BF16 weights add to the base's."""
    trained = params if trainable is None else trainable
    w, g, o = weight_bytes_per_param(options), grad_bytes_per_param(options), optimizer_bytes_per_param(options)
    shard_dense, shard_expert = optimizer_shards(layout, options)
    optimizer = trained.dense * o / shard_dense + trained.expert * o / shard_expert
    # Muon keeps one momentum, but the vocabulary stays on Adam (scalar_optimizer_bytes_per_param).
    optimizer += trained.vocab * (scalar_optimizer_bytes_per_param(options) - o) / shard_dense
    sharded, vocab, held = params.total, params.vocab, trained.total  # held whole without FSDP
    if shards_params(options):
        sharded = params.dense / shard_dense + params.expert / shard_expert
        vocab = params.vocab / shard_dense
    if shards_grads(options):
        held = trained.dense / shard_dense + trained.expert / shard_expert
    unit_weights, unit_grads = unit_buffer_bytes(unit_params, w, g, options)
    weights, grads = (sharded - vocab) * w + vocab * BF16 + unit_weights, held * g + unit_grads
    frozen = 0.0
    if trainable is not None:
        frozen = weights
        weights += held * BF16
    on_gpu = 1.0 - options.optimizer_offload_fraction
    master = (trained.dense / shard_dense + trained.expert / shard_expert) * master_param_bytes(options)
    master_share = master / optimizer if optimizer else 0.0
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
    unit = fsdp_unit_params(params, stage) if shards_params(options) else 0.0
    if not options.is_lora:
        return params, model_state_bytes(params, layout, options, architecture=architecture, unit_params=unit)
    adapters = stage_lora_params_per_gpu(model, layout, stage, options)
    return adapters, model_state_bytes(
        params, layout, options, architecture=architecture, trainable=adapters, unit_params=unit
    )


def fsdp_unit_params(params: StageParams, stage: PipelineStage) -> float:
    """One Megatron-FSDP unit (a decoder layer) on a GPU of the stage: the stage's non-vocabulary
    parameters over its decoder and MTP layers (the units, mcore_fsdp_adapter.py:158-162)."""
    layers = sum(count for _, count in stage.layer_groups) + stage.mtp_layers
    return (params.total - params.vocab) / max(layers, 1)


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
