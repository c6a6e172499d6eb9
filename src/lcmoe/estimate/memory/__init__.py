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

Modules: ``constants`` (byte widths and sourced fixed sizes), ``coefficients`` (the fitted
coefficients and their priors), ``state`` (parameters, weights, gradients, optimizer state),
``activations`` (per-block stored activations by mixer), ``layers`` (per-layer and per-chunk
activations, LoRA, offloading, MTP, recompute), ``transients`` (working sets, workspaces, graph
pools, dispatcher buffers), ``results`` (StageMemory, MemoryEstimate) and ``stage`` (assembly,
``estimate_memory``). Every name is re-exported here.
"""

from __future__ import annotations

from lcmoe.estimate.memory.activations import (
    GDN_CHUNK,
    TokenShape,
    core_attention_bytes,
    dense_mlp_activation_bytes,
    dispatched_tokens,
    dropout_mask_bytes,
    dsa_attention_activation_bytes,
    gdn_activation_bytes,
    gdn_chunk_backward_bytes,
    gqa_attention_activation_bytes,
    mamba_activation_bytes,
    mla_attention_activation_bytes,
    mla_latent_bytes,
    moe_activation_bytes,
    moe_norm_output_bytes,
    moe_norm_recompute_allowed,
    norm_bytes,
    token_shape,
)
from lcmoe.estimate.memory.coefficients import (
    COEFFICIENTS_FILE,
    CUDA_CONTEXT_PRIOR_BYTES,
    FRAGMENTATION_NO_EXPANDABLE_PRIOR,
    FRAGMENTATION_PRIOR,
    NCCL_BUFFER_PRIOR_BYTES,
    MemoryCoefficients,
    shipped_coefficients,
)
from lcmoe.estimate.memory.constants import (
    BF16,
    DEEPEP_BUFFER_BYTES,
    DEEPEP_NVL_PEERS,
    DEFAULT_NVLINK_DOMAIN,
    FP32,
    FULL_ITERATION_RANK_CAPACITY,
    FULL_ITERATION_STASH_FACTOR,
    GIB,
    HYBRIDEP_SCALE_BLOCK,
    INT32,
    INT64,
    MIB,
    MXFP8_SCALE_BLOCK,
    NVFP4_BYTES,
    NVFP4_SCALE_BLOCK,
    TE_CUBLAS_WORKSPACE_BYTES,
    TE_CUBLAS_WORKSPACE_BYTES_PRE_HOPPER,
    TE_GROUPED_GEMM_STREAMS,
)
from lcmoe.estimate.memory.layers import (
    activation_offload_saving,
    chunk_layer_bytes,
    embedding_activation_bytes,
    full_recompute_bytes,
    layer_activation_bytes,
    lora_activation_bytes,
    mtp_layer_activation_bytes,
)
from lcmoe.estimate.memory.results import (
    MemoryEstimate,
    StageMemory,
)
from lcmoe.estimate.memory.stage import (
    LayerCache,
    StageInputs,
    StagePeak,
    StageTerms,
    attention_kernel,
    chunk_activation_bytes,
    estimate_memory,
    largest_replayed_layer,
    stage_activations,
    stage_memory,
    stage_peak,
    stage_terms,
    stage_transient,
)
from lcmoe.estimate.memory.state import (
    ModelState,
    StagedLayout,
    StageParams,
    grad_bytes_per_param,
    master_param_bytes,
    model_state_bytes,
    optimizer_bytes_per_param,
    optimizer_grad_copy_bytes,
    optimizer_shards,
    quantized_usage_bytes,
    quantized_weight_copy_bytes,
    stage_lora_params_per_gpu,
    stage_params_per_gpu,
    stage_state_bytes,
    stage_trained_params_per_gpu,
    staged_layout,
    weight_bytes_per_param,
)
from lcmoe.estimate.memory.transients import (
    DSA_SCORE_CHUNK_BYTES,
    DSA_TOPK_SCRATCH_BYTES,
    FLASH_MLA_MIN_HEADS,
    cp_p2p_attention_forward_bytes,
    cuda_graph_pool_bytes,
    dispatcher_buffer_bytes,
    dsa_kernel_scratch_bytes,
    dsa_sparse_backward_bytes,
    graphed_modules,
    hybridep_buffer_bytes,
    logits_loss_bytes,
    mamba_scan_backward_bytes,
    moe_dispatch_transient_bytes,
    replayed_options,
    stage_holds,
    stage_mixer_transients,
    te_workspace_bytes,
)

__all__ = [
    "BF16",
    "COEFFICIENTS_FILE",
    "CUDA_CONTEXT_PRIOR_BYTES",
    "DEEPEP_BUFFER_BYTES",
    "DEEPEP_NVL_PEERS",
    "DEFAULT_NVLINK_DOMAIN",
    "DSA_SCORE_CHUNK_BYTES",
    "DSA_TOPK_SCRATCH_BYTES",
    "FLASH_MLA_MIN_HEADS",
    "FP32",
    "FRAGMENTATION_NO_EXPANDABLE_PRIOR",
    "FRAGMENTATION_PRIOR",
    "FULL_ITERATION_RANK_CAPACITY",
    "FULL_ITERATION_STASH_FACTOR",
    "GDN_CHUNK",
    "GIB",
    "HYBRIDEP_SCALE_BLOCK",
    "INT32",
    "INT64",
    "MIB",
    "MXFP8_SCALE_BLOCK",
    "NCCL_BUFFER_PRIOR_BYTES",
    "NVFP4_BYTES",
    "NVFP4_SCALE_BLOCK",
    "TE_CUBLAS_WORKSPACE_BYTES",
    "TE_CUBLAS_WORKSPACE_BYTES_PRE_HOPPER",
    "TE_GROUPED_GEMM_STREAMS",
    "LayerCache",
    "MemoryCoefficients",
    "MemoryEstimate",
    "ModelState",
    "StageInputs",
    "StageMemory",
    "StageParams",
    "StagePeak",
    "StageTerms",
    "StagedLayout",
    "TokenShape",
    "activation_offload_saving",
    "attention_kernel",
    "chunk_activation_bytes",
    "chunk_layer_bytes",
    "core_attention_bytes",
    "cp_p2p_attention_forward_bytes",
    "cuda_graph_pool_bytes",
    "dense_mlp_activation_bytes",
    "dispatched_tokens",
    "dispatcher_buffer_bytes",
    "dropout_mask_bytes",
    "dsa_attention_activation_bytes",
    "dsa_kernel_scratch_bytes",
    "dsa_sparse_backward_bytes",
    "embedding_activation_bytes",
    "estimate_memory",
    "full_recompute_bytes",
    "gdn_activation_bytes",
    "gdn_chunk_backward_bytes",
    "gqa_attention_activation_bytes",
    "grad_bytes_per_param",
    "graphed_modules",
    "hybridep_buffer_bytes",
    "largest_replayed_layer",
    "layer_activation_bytes",
    "logits_loss_bytes",
    "lora_activation_bytes",
    "mamba_activation_bytes",
    "mamba_scan_backward_bytes",
    "master_param_bytes",
    "mla_attention_activation_bytes",
    "mla_latent_bytes",
    "model_state_bytes",
    "moe_activation_bytes",
    "moe_dispatch_transient_bytes",
    "moe_norm_output_bytes",
    "moe_norm_recompute_allowed",
    "mtp_layer_activation_bytes",
    "norm_bytes",
    "optimizer_bytes_per_param",
    "optimizer_grad_copy_bytes",
    "optimizer_shards",
    "quantized_usage_bytes",
    "quantized_weight_copy_bytes",
    "replayed_options",
    "shipped_coefficients",
    "stage_activations",
    "stage_holds",
    "stage_lora_params_per_gpu",
    "stage_memory",
    "stage_mixer_transients",
    "stage_params_per_gpu",
    "stage_peak",
    "stage_state_bytes",
    "stage_terms",
    "stage_trained_params_per_gpu",
    "stage_transient",
    "staged_layout",
    "te_workspace_bytes",
    "token_shape",
    "weight_bytes_per_param",
]
