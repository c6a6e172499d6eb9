"""Megatron-Core ``TransformerConfig`` / ``MLATransformerConfig`` keyword arguments for a plan.

Pure data (no torch import): the caller adds the dtypes. Tests build the real config from these
values so that Megatron's own ``__post_init__`` validation judges what lcmoe emits. TE-only
features (fused permutation, FP8 recipes, RoPE fusion) are left at their defaults because their
checks need Transformer Engine (dependencies.md §1, "TE-dependent checks").
"""

from __future__ import annotations

from typing import Any

from lcmoe.config_io.activation_offload import mcore_offload_kwargs
from lcmoe.config_io.dynamic_cp import mcore_dynamic_cp_kwargs
from lcmoe.config_io.paged_stash import mcore_stash_kwargs
from lcmoe.run import RunConfig
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


def transformer_config_kwargs(run: RunConfig) -> tuple[str, dict[str, Any]]:
    """(class name, kwargs) for ``megatron.core.transformer.transformer_config``."""
    model, lay, opt = run.model, run.layout, run.options
    kwargs: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "gated_linear_unit": model.gated_linear_unit,
        "add_bias_linear": model.add_bias_linear,
        "add_qkv_bias": model.add_qkv_bias,
        "qk_layernorm": model.qk_layernorm,
        "bf16": True,
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "context_parallel_size": lay.cp,
        "expert_model_parallel_size": lay.ep,
        "expert_tensor_parallel_size": lay.etp,
        "sequence_parallel": lay.sequence_parallel and lay.tp > 1,
        "cp_comm_type": lay.cp_comm_type,
    }
    if lay.hierarchical_context_parallel_sizes:  # a2a+p2p (model_parallel_config.py:103)
        kwargs["hierarchical_context_parallel_sizes"] = list(lay.hierarchical_context_parallel_sizes)
    if lay.pipeline_layout:
        kwargs["pipeline_model_parallel_layout"] = lay.pipeline_layout
    elif lay.vpp > 1:
        kwargs["virtual_pipeline_model_parallel_size"] = lay.vpp
    # Where both groups set experimental_attention_variant, the later one (gated_delta_net) wins.
    kwargs |= _attention_kwargs(model)
    kwargs |= _sequence_mixer_kwargs(model)
    if model.is_moe:
        kwargs |= _moe_kwargs(model, opt)
    if model.mtp_num_layers:
        kwargs["mtp_num_layers"] = model.mtp_num_layers
    if opt.recompute_granularity == "selective":
        kwargs.update(recompute_granularity="selective", recompute_modules=sorted(opt.recompute_modules))
    elif opt.recompute_granularity == "full":
        kwargs.update(
            recompute_granularity="full",
            recompute_method=opt.recompute_method,
            recompute_num_layers=opt.recompute_num_layers,
        )
    kwargs.update(mcore_offload_kwargs(opt))
    kwargs.update(mcore_dynamic_cp_kwargs(run))
    kwargs.update(mcore_stash_kwargs(opt))
    return ("MLATransformerConfig" if model.multi_latent_attention else "TransformerConfig"), kwargs


def _attention_kwargs(model: ModelSpec) -> dict[str, Any]:
    """Attention: MLA or grouped-query heads, DSA's indexer, the output gate, sliding windows."""
    kwargs: dict[str, Any] = {}
    if model.multi_latent_attention:
        kwargs.update(
            q_lora_rank=model.q_lora_rank,
            kv_lora_rank=model.kv_lora_rank,
            qk_head_dim=model.qk_head_dim,
            qk_pos_emb_head_dim=model.qk_pos_emb_head_dim,
            v_head_dim=model.v_head_dim,
        )
    else:
        kwargs.update(num_query_groups=model.query_groups, kv_channels=model.head_dim)
    if model.is_dsa:
        kwargs.update(
            experimental_attention_variant="dsa",
            dsa_indexer_n_heads=model.dsa_indexer_n_heads,
            dsa_indexer_head_dim=model.dsa_indexer_head_dim,
            dsa_indexer_topk=model.dsa_indexer_topk,
            dsa_indexer_loss_coeff=model.dsa_indexer_loss_coeff,
            dsa_indexer_use_sparse_loss=model.dsa_indexer_use_sparse_loss,
        )
        if model.shares_dsa_topk:  # fields from megatron-core 0.19 on (L-DSA-VERSION)
            kwargs.update(
                dsa_indexer_topk_freq=model.dsa_indexer_topk_freq,
                dsa_indexer_skip_topk_offset=model.dsa_indexer_skip_topk_offset,
            )
    if model.attention_output_gate:
        kwargs["attention_output_gate"] = True
    if model.window_size is not None:
        kwargs["window_size"] = model.window_size
        if model.window_attn_skip_freq is not None:
            kwargs["window_attn_skip_freq"] = model.window_attn_skip_freq
    return kwargs


def _sequence_mixer_kwargs(model: ModelSpec) -> dict[str, Any]:
    """Gated DeltaNet linear attention and hybrid Mamba layers."""
    kwargs: dict[str, Any] = {}
    if model.linear_attention_type == "gdn":
        kwargs.update(
            experimental_attention_variant="gated_delta_net",
            linear_attention_freq=model.linear_attention_freq,
            linear_num_key_heads=model.linear_num_key_heads,
            linear_num_value_heads=model.linear_num_value_heads,
            linear_key_head_dim=model.linear_key_head_dim,
            linear_value_head_dim=model.linear_value_head_dim,
            linear_conv_kernel_dim=model.linear_conv_kernel_dim,
        )
    if model.is_hybrid:
        # The layer pattern itself goes to HybridModel (hybrid_layer_pattern), not the config.
        kwargs.update(
            is_hybrid_model=True,
            mamba_num_heads=model.mamba_num_heads,
            mamba_head_dim=model.mamba_head_dim,
            mamba_state_dim=model.mamba_state_dim,
            mamba_num_groups=model.mamba_num_groups,
        )
    return kwargs


def _moe_kwargs(model: ModelSpec, opt: TrainingOptions) -> dict[str, Any]:
    """The experts, the router and the token dispatcher of an MoE model."""
    kwargs: dict[str, Any] = {
        "num_moe_experts": model.num_moe_experts,
        "moe_ffn_hidden_size": model.expert_ffn,
        "moe_router_topk": model.moe_router_topk,
        "moe_grouped_gemm": True,
        "overlap_moe_expert_parallel_comm": opt.overlap_moe_expert_parallel_comm,
    }
    if opt.delay_wgrad_compute:
        # A ModelParallelConfig field (model_parallel_config.py:348), so a TransformerConfig kwarg.
        kwargs["delay_wgrad_compute"] = True
    if not model.is_hybrid:
        kwargs["moe_layer_freq"] = [int(x) for x in model.moe_layer_pattern()]
    if model.shared_ffn:
        kwargs["moe_shared_expert_intermediate_size"] = model.shared_ffn
    if model.moe_router_num_groups:
        kwargs.update(
            moe_router_num_groups=model.moe_router_num_groups, moe_router_group_topk=model.moe_router_group_topk
        )
    if model.moe_router_enable_expert_bias:
        kwargs.update(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")
    if model.moe_router_topk == 1:
        kwargs["moe_router_pre_softmax"] = True
    if opt.dispatcher in ("deepep", "hybridep"):
        kwargs["moe_token_dispatcher_type"] = "flex"
    else:
        kwargs["moe_token_dispatcher_type"] = opt.dispatcher
    return kwargs
