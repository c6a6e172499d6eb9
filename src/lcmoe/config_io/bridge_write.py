"""Megatron Bridge overrides that realise a run (``overrides_from_run``)."""

from __future__ import annotations

from typing import Any

from lcmoe.config_io.activation_offload import bridge_offload_overrides
from lcmoe.config_io.bridge_precision import mixed_precision_override
from lcmoe.config_io.bridge_recipes import ep_overlap_key
from lcmoe.config_io.dynamic_cp import bridge_dynamic_cp_overrides
from lcmoe.config_io.paged_stash import bridge_stash_overrides
from lcmoe.layout import ParallelLayout
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions


def overrides_from_run(run: RunConfig) -> dict[str, Any]:
    """KEY=VALUE overrides for ``scripts/training/run_recipe.py`` that realise ``run``."""
    lay, opt = run.layout, run.options
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": lay.tp,
        "model.pipeline_model_parallel_size": lay.pp,
        "model.virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "model.context_parallel_size": lay.cp,
        "model.expert_model_parallel_size": lay.ep,
        "model.expert_tensor_parallel_size": lay.etp,
        "model.sequence_parallel": lay.sequence_parallel and lay.tp > 1,
        "model.seq_length": opt.seq_len,
        "dataset.seq_length": opt.seq_len,
        "train.micro_batch_size": lay.mbs,
        "train.global_batch_size": lay.gbs,
        "mixed_precision": mixed_precision_override(run),
    }
    # The sections add disjoint keys, in this order (the order overrides.txt lists them).
    out |= _context_parallel(lay)
    out |= _pipeline_layout(lay)
    out |= _recompute(opt)
    if run.model.is_moe:
        out |= _moe(run)
    out |= _cuda_graphs(opt)
    out |= _optimizer(opt)
    if opt.doc_lengths is not None:
        # One attention mask per document: GPTDataset returns cu_seqlens of the document
        # boundaries inside each sample (mcore datasets/gpt_dataset.py:80-82, 287-333), which
        # Bridge's GPTDatasetConfig inherits.
        out["dataset.inter_document_masking"] = True
    out |= bridge_dynamic_cp_overrides(run)  # {} without dynamic CP
    if opt.is_lora:
        # The PEFT recipe (``recipe_for``) builds cfg.peft = LoRA(); these set its fields (peft/lora.py).
        out["peft.dim"] = opt.lora_rank
        out["peft.target_modules"] = sorted(opt.lora_targets)
        out["peft.sequence_parallel_input_regather"] = opt.lora_input_regather
    return out


def _context_parallel(lay: ParallelLayout) -> dict[str, Any]:
    """The CP exchange (unset without CP)."""
    out: dict[str, Any] = {}
    if lay.cp > 1:
        out["model.cp_comm_type"] = lay.cp_comm_type
        if lay.hierarchical_context_parallel_sizes:  # a2a+p2p only (config.py:1543-1557)
            out["model.hierarchical_context_parallel_sizes"] = list(lay.hierarchical_context_parallel_sizes)
    return out


def _pipeline_layout(lay: ParallelLayout) -> dict[str, Any]:
    """The explicit pipeline layout, or None to clear a recipe's."""
    out: dict[str, Any] = {}
    if lay.pipeline_layout:
        # VPP stays explicit next to the layout (MCore checks it equals the layout's stage count /
        # PP, transformer_config.py:1973): Bridge's EP-overlap setup asserts VPP is set when
        # PP > 1 before the layout is parsed (comm_overlap.py:495).
        out["model.pipeline_model_parallel_layout"] = lay.pipeline_layout
        # A layout "cannot be set with other pipeline layout arguments" (MCore
        # transformer_config.py): clear what a recipe may carry (Qwen3-235B sets both account_for_*).
        out["model.account_for_embedding_in_pipeline_split"] = False
        out["model.account_for_loss_in_pipeline_split"] = False
        out["model.num_layers_in_first_pipeline_stage"] = None
        out["model.num_layers_in_last_pipeline_stage"] = None
    else:
        # Cleared, not omitted: a recipe's own layout (DeepSeek-V3 ships one for its PP) would
        # otherwise survive, and Bridge would derive VPP = its stage count / PP from it.
        out["model.pipeline_model_parallel_layout"] = None
    return out


def _recompute(opt: TrainingOptions) -> dict[str, Any]:
    """Every recompute field, so nothing a recipe set survives: Bridge's EP-overlap setup refuses a
    leftover "moe" module, method or layer count even when granularity is None
    (comm_overlap.py:498-511; the Qwen3-Next recipe sets [layernorm, moe, moe_act])."""
    if opt.recompute_granularity == "full":
        return {
            "model.recompute_granularity": "full",
            "model.recompute_method": opt.recompute_method,
            "model.recompute_num_layers": opt.recompute_num_layers,
            "model.recompute_modules": [],
        }
    selective = opt.recompute_granularity == "selective"
    return {
        "model.recompute_granularity": "selective" if selective else None,
        "model.recompute_modules": sorted(opt.recompute_modules) if selective else [],
        "model.recompute_method": None,
        "model.recompute_num_layers": None,
    }


def _moe(run: RunConfig) -> dict[str, Any]:
    """The token dispatcher and EP overlap of an MoE model."""
    opt = run.options
    out: dict[str, Any] = {}
    if opt.dispatcher in ("deepep", "hybridep"):
        out["model.moe_token_dispatcher_type"] = "flex"
        out["model.moe_flex_dispatcher_backend"] = opt.dispatcher
    else:
        out["model.moe_token_dispatcher_type"] = opt.dispatcher
    key = ep_overlap_key(run.model, opt, run.hardware)
    out[key] = opt.overlap_moe_expert_parallel_comm
    if opt.delay_wgrad_compute:
        # Set where EP overlap is set: CommOverlapConfig.setup writes both onto the model
        # (comm_overlap.py:438-439, :604-619); without one the model field is what runs.
        out[key.replace("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")] = True
    out.update(bridge_stash_overrides(opt))
    # LatentMoE refuses shared-expert overlap in training (moe_layer.py:476-487).
    if opt.overlap_moe_expert_parallel_comm or run.model.moe_latent_size:
        out["model.moe_shared_expert_overlap"] = False
    return out


def _cuda_graphs(opt: TrainingOptions) -> dict[str, Any]:
    """The CUDA graph implementation and scopes."""
    if not opt.cuda_graph_scope:
        return {"model.cuda_graph_impl": "none"}
    out: dict[str, Any] = {}
    if "full_iteration" in opt.cuda_graph_scope:
        out["model.cuda_graph_impl"] = "local"
        out["model.cuda_graph_scope"] = ["full_iteration"]
        out["rerun_state_machine.check_for_nan_in_loss"] = False
    else:
        out["model.cuda_graph_impl"] = "transformer_engine"
        out["model.cuda_graph_scope"] = sorted(opt.cuda_graph_scope)
    out["model.use_te_rng_tracker"] = True
    out["rng.te_rng_tracker"] = True
    return out


def _optimizer(opt: TrainingOptions) -> dict[str, Any]:
    """The distributed optimizer, a precision-aware optimizer's dtypes and optimizer offload."""
    out: dict[str, Any] = {
        "ddp.use_distributed_optimizer": opt.distributed_optimizer,
        "optimizer.use_distributed_optimizer": opt.distributed_optimizer,
    }
    if opt.precision_aware_optimizer:
        out["optimizer.use_precision_aware_optimizer"] = True
        out["optimizer.main_grads_dtype"] = "bf16" if opt.main_grads_dtype == "bf16" else "fp32"
        out["optimizer.exp_avg_dtype"] = opt.exp_avg_dtype
        out["optimizer.exp_avg_sq_dtype"] = opt.exp_avg_dtype
        if opt.main_params_dtype != "fp32":
            out["optimizer.main_params_dtype"] = opt.main_params_dtype
    if opt.optimizer_offload_fraction > 0:
        out["optimizer.optimizer_cpu_offload"] = True
        out["optimizer.optimizer_offload_fraction"] = opt.optimizer_offload_fraction
        out["optimizer.overlap_cpu_optimizer_d2h_h2d"] = True
    out.update(bridge_offload_overrides(opt))
    out.update(_muon(opt))
    return out


def _muon(opt: TrainingOptions) -> dict[str, Any]:
    """Muon (Bridge optim.py:95-110): ``optimizer.optimizer`` ``dist_muon`` runs Megatron-Core's
    layer-wise distributed optimizer (``distributed_optimizer`` here), ``muon`` the replicated one;
    either with DDP's distributed optimizer, the parameter-gather overlap and the precision-aware
    optimizer off and FP32 optimizer dtypes, as Bridge's Kimi-K2 recipe sets them
    (recipes/kimi/h100/kimi_k2.py:66-87; Bridge turns both ``use_distributed_optimizer`` fields on
    when either is, config.py:1955-1981)."""
    if opt.optimizer != "muon":
        return {}
    # The precision-aware optimizer is Adam only (optimizer_config.py:430-433); without it every
    # optimizer dtype is FP32 (:467-481). Written out, since perf recipes turn it on (Qwen3's
    # does); a run that asks for it is written as asked, for Megatron-Core to refuse as
    # L-MUON-PRECISION-AWARE does.
    plain = (
        {}
        if opt.precision_aware_optimizer
        else {
            "optimizer.use_precision_aware_optimizer": False,
            **{f"optimizer.{name}": "fp32" for name in _OPTIMIZER_DTYPES},
        }
    )
    return plain | {
        "optimizer.optimizer": "dist_muon" if opt.distributed_optimizer else "muon",
        "ddp.use_distributed_optimizer": False,
        "optimizer.use_distributed_optimizer": False,
        "ddp.overlap_param_gather": False,
        "optimizer.overlap_param_gather": False,
        "optimizer.muon_num_ns_steps": opt.muon_num_ns_steps,
        "optimizer.muon_tp_mode": opt.muon_tp_mode,
    }


_OPTIMIZER_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
