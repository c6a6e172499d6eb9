"""The same run as Megatron-LM ``pretrain_gpt.py`` arguments (flag spellings of
megatron/training/arguments.py)."""

from __future__ import annotations

from lcmoe.config_io.activation_offload import megatron_offload_args
from lcmoe.config_io.dynamic_cp import megatron_dynamic_cp_args
from lcmoe.config_io.paged_stash import megatron_stash_args
from lcmoe.layout import ParallelLayout
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions

_FP8_RECIPE = {"fp8-tensorwise": "tensorwise", "fp8-delayed": "delayed", "fp8-blockwise": "blockwise", "mxfp8": "mxfp8"}


NO_LORA = "# Megatron-LM's pretrain_gpt.py has no LoRA: launch this plan with Megatron Bridge."


def megatron_lm_text(run: RunConfig) -> str:
    """The arguments one per line, or for a LoRA run (which Megatron-LM cannot train) a comment
    that says so."""
    return NO_LORA if run.options.is_lora else "\n".join(megatron_lm_args(run))


def megatron_lm_args(run: RunConfig) -> list[str]:
    """The ``pretrain_gpt.py`` flags that realise ``run``, in a fixed order."""
    lay, opt = run.layout, run.options
    args = [
        f"--tensor-model-parallel-size={lay.tp}",
        f"--pipeline-model-parallel-size={lay.pp}",
        f"--context-parallel-size={lay.cp}",
        f"--expert-model-parallel-size={lay.ep}",
        f"--expert-tensor-parallel-size={lay.etp}",
        f"--micro-batch-size={lay.mbs}",
        f"--global-batch-size={lay.gbs}",
        f"--seq-length={opt.seq_len}",
        f"--max-position-embeddings={opt.seq_len}",
        "--bf16",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        # lcmoe's memory plan assumes no dropout masks (the MoE recipes train without dropout).
        "--hidden-dropout=0.0",
        "--attention-dropout=0.0",
    ]
    args += _layout_args(lay)
    args += _precision_args(opt)
    args += _recompute_args(opt)
    if run.model.is_moe:
        args += _moe_args(run)
    args += _cuda_graph_args(opt)
    args += _optimizer_args(opt)
    if opt.doc_lengths is not None:
        # Per-document attention masks from the document boundaries (arguments.py, dataloader group).
        args.append("--dataloader-inter-document-masking")
    if opt.optimizer_offload_fraction > 0:
        args += [
            "--optimizer-cpu-offload",
            f"--optimizer-offload-fraction={opt.optimizer_offload_fraction}",
            "--overlap-cpu-optimizer-d2h-h2d",
        ]
    args += megatron_offload_args(opt)
    args += megatron_dynamic_cp_args(run)
    args += megatron_stash_args(opt)
    return _with_muon(args, opt)


def _with_muon(args: list[str], opt: TrainingOptions) -> list[str]:
    """Muon: ``--optimizer=muon`` and its NS settings (arguments.py:2518-2548, :2777); with
    ``--use-distributed-optimizer`` Megatron-LM runs the layer-wise distributed optimizer
    (arguments.py:1669-1682), without it every rank keeps the whole state. No
    ``--overlap-param-gather``: the layer-wise all-gather runs after the step, as lcmoe prices it
    (estimate.muon) and Bridge's Kimi-K2 recipe runs it."""
    if opt.optimizer != "muon":
        return args
    dropped = {"--overlap-param-gather"} | (set() if opt.distributed_optimizer else {"--use-distributed-optimizer"})
    return [a for a in args if a not in dropped] + [
        "--optimizer=muon",
        f"--muon-num-ns-steps={opt.muon_num_ns_steps}",
        f"--muon-tp-mode={opt.muon_tp_mode}",
    ]


def _layout_args(lay: ParallelLayout) -> list[str]:
    """Sequence parallel, the CP exchange and the pipeline layout (or plain VPP)."""
    args = []
    if lay.sequence_parallel and lay.tp > 1:
        args.append("--sequence-parallel")
    if lay.cp > 1:
        args.append(f"--cp-comm-type={lay.cp_comm_type}")
        if lay.hierarchical_context_parallel_sizes:  # nargs='+' (arguments.py:562-567)
            args += ["--hierarchical-context-parallel-sizes", *map(str, lay.hierarchical_context_parallel_sizes)]
    if lay.pipeline_layout:
        args.append(f"--pipeline-model-parallel-layout={lay.pipeline_layout}")
    elif lay.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank={lay.vpp}")
    return args


def _precision_args(opt: TrainingOptions) -> list[str]:
    """The FP8 or FP4 format and recipe, and quantized parameters (BF16 needs no flag here)."""
    args = []
    if opt.precision in _FP8_RECIPE:
        args += [
            "--fp8-format=e4m3" if opt.precision in ("mxfp8", "fp8-blockwise") else "--fp8-format=hybrid",
            f"--fp8-recipe={_FP8_RECIPE[opt.precision]}",
        ]
        if opt.quantized_params:  # the FP8 parameters the memory estimate assumed
            args.append("--fp8-param-gather")
    elif opt.precision == "nvfp4":
        args += ["--fp4-format=e2m1", "--fp4-recipe=nvfp4"]
        if opt.quantized_params:
            args.append("--fp4-param-gather")
    return args


def _recompute_args(opt: TrainingOptions) -> list[str]:
    if opt.recompute_granularity == "selective":
        return ["--recompute-granularity=selective", "--recompute-modules", *sorted(opt.recompute_modules)]
    if opt.recompute_granularity == "full":
        return [
            "--recompute-granularity=full",
            f"--recompute-method={opt.recompute_method}",
            f"--recompute-num-layers={opt.recompute_num_layers}",
        ]
    return []


def _moe_args(run: RunConfig) -> list[str]:
    """The experts, the router's dtype, the token dispatcher and EP overlap."""
    model, opt = run.model, run.options
    args = [
        f"--num-experts={model.num_moe_experts}",
        f"--moe-router-topk={model.moe_router_topk}",
        "--moe-grouped-gemm",
        "--moe-router-dtype=fp32",
    ]
    if opt.dispatcher in ("deepep", "hybridep"):
        args += ["--moe-token-dispatcher-type=flex", f"--moe-flex-dispatcher-backend={opt.dispatcher}"]
    else:
        args.append(f"--moe-token-dispatcher-type={opt.dispatcher}")
    if opt.overlap_moe_expert_parallel_comm:
        args.append("--overlap-moe-expert-parallel-comm")
    if opt.delay_wgrad_compute:
        # Built from the TransformerConfig field (arguments.py:2290, model_parallel_config.py:348).
        args.append("--delay-wgrad-compute")
    return args


def _cuda_graph_args(opt: TrainingOptions) -> list[str]:
    if not opt.cuda_graph_scope:
        return []
    if "full_iteration" in opt.cuda_graph_scope:
        return ["--cuda-graph-impl=local", "--cuda-graph-scope=full_iteration"]
    return [
        "--cuda-graph-impl=transformer_engine",
        "--cuda-graph-scope",
        *sorted(opt.cuda_graph_scope),
        "--te-rng-tracker",
    ]


def _optimizer_args(opt: TrainingOptions) -> list[str]:
    """A precision-aware optimizer's dtypes, or a BF16 gradient buffer with the plain one."""
    if opt.precision_aware_optimizer:
        args = [
            "--use-precision-aware-optimizer",
            f"--main-grads-dtype={opt.main_grads_dtype}",
            f"--exp-avg-dtype={opt.exp_avg_dtype}",
            f"--exp-avg-sq-dtype={opt.exp_avg_dtype}",
        ]
        if opt.main_params_dtype != "fp32":
            args.append(f"--main-params-dtype={opt.main_params_dtype}")
        return args
    if opt.main_grads_dtype == "bf16":
        # A BF16 gradient buffer with the plain optimizer (arguments.py: grad_reduce_in_bf16 turns
        # accumulate_allreduce_grads_in_fp32 off).
        return ["--grad-reduce-in-bf16"]
    return []
