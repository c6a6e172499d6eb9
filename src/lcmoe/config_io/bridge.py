"""Megatron Bridge configuration spellings (megatron-bridge-facts.md §1.2–1.4).

Bridge quirks this module encodes: precision goes through ``mixed_precision`` (a registered
recipe name), EP overlap through ``comm_overlap.*`` where the recipe has a ``CommOverlapConfig``
(its ``setup`` rewrites ``model.overlap_moe_expert_parallel_comm`` at start-up) and through the
model field where it has none (``comm_overlap`` is None: a ``comm_overlap.*`` override is refused
by Hydra), dispatcher type and flex backend are set together, an explicit
``model.pipeline_model_parallel_layout`` is written whenever layers do not split evenly, and
``model.seq_length`` must equal ``dataset.seq_length``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml

from lcmoe.config_io.activation_offload import bridge_offload_options, bridge_offload_overrides
from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, read_hierarchical_sizes
from lcmoe.run import RunConfig, derive_dp
from lcmoe.specs.doc_lengths import DocLengths, unknown_lengths
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.units import real_number, whole_number
from lcmoe.workload import LORA_TARGETS, TrainingOptions, lora_fields


@dataclass(frozen=True, slots=True)
class RecipeTable:
    """``catalog/bridge_recipes.yaml``: model → recipe (per GPU) and what each recipe holds."""

    default: dict[str, str]
    by_gpu: dict[str, dict[str, str]]
    peft: dict[str, str | None]
    comm_overlap: frozenset[str]
    mixed_precision_object: frozenset[str]
    known: frozenset[str]


@functools.cache
def recipe_table() -> RecipeTable:
    """The shipped recipe table (package data, read once)."""
    text = resources.files("lcmoe.catalog").joinpath("bridge_recipes.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    models, recipes = data["models"], data["recipes"]
    return RecipeTable(
        default={name: entry["recipe"] for name, entry in models.items()},
        by_gpu={name: dict(entry.get("by_gpu") or {}) for name, entry in models.items()},
        peft={name: entry.get("peft") for name, entry in models.items()},
        comm_overlap=frozenset(name for name, entry in recipes.items() if entry["comm_overlap"]),
        mixed_precision_object=frozenset(name for name, entry in recipes.items() if entry["mixed_precision_object"]),
        known=frozenset(recipes),
    )


def has_recipe(model: ModelSpec) -> bool:
    """Whether Megatron Bridge ships a recipe for this model (``catalog/bridge_recipes.yaml``)."""
    return model.name in recipe_table().default


def recipe_name(model: ModelSpec, options: TrainingOptions, hardware: HardwareSpec | None = None) -> str:
    """The model's pretraining recipe for ``hardware`` (Bridge's GPU-specific one where it ships
    one), or under LoRA its PEFT recipe; ``your_recipe_config`` for a model Bridge has none for."""
    table = recipe_table()
    if options.is_lora:
        return table.peft.get(model.name) or peft_recipe_name(table.default.get(model.name, "your_recipe_config"))
    gpu = hardware.name.lower() if hardware is not None else ""
    return table.by_gpu.get(model.name, {}).get(gpu) or table.default.get(model.name, "your_recipe_config")


def recipe_for(model: ModelSpec, options: TrainingOptions, hardware: HardwareSpec | None = None) -> str | None:
    """The Bridge recipe a run launches from (``recipe_name``; a LoRA run is launched with
    ``--mode lora``); None for a model Bridge ships no recipe for; refused for a LoRA run of a model
    Bridge has no PEFT recipe for."""
    if not has_recipe(model):
        return None
    if options.is_lora and not recipe_table().peft.get(model.name):
        peft_models = sorted(name for name, peft in recipe_table().peft.items() if peft)
        raise LcmoeError(
            "peft",
            "lora",
            f"has no Megatron Bridge recipe for {model.name} (Bridge ships <model>_peft_config recipes only for "
            f"{', '.join(peft_models)})",
            "write the LoRA config yourself from the emitted overrides, or plan full training",
        )
    return recipe_name(model, options, hardware)


def peft_recipe_name(recipe: str) -> str:
    """``llama3_70b_pretrain_config`` → ``llama3_70b_peft_config``."""
    return recipe.removesuffix("_pretrain_config") + "_peft_config"


def recipe_has_comm_overlap(recipe: str) -> bool:
    """Whether the recipe's ConfigContainer carries a CommOverlapConfig (megatron-bridge 0.6.2);
    a recipe not in the table (a user's own) is assumed to be like Bridge's: pretraining recipes
    carry one, PEFT recipes (``_peft_common``) do not."""
    table = recipe_table()
    if recipe in table.known:
        return recipe in table.comm_overlap
    return not recipe.endswith("_peft_config")


def override_key(key: str) -> str:
    """A ``KEY=VALUE`` override's spelling: ``cfg.peft`` is declared as the PEFT base class, so
    Hydra's struct mode knows none of LoRA's fields and they must be appended (``+peft.dim=…``;
    megatron-bridge 0.6.2 refuses ``peft.dim=…`` and ``++``, tests/test_bridge_runtime.py)."""
    return "+" + key if key.startswith("peft.") else key


def ep_overlap_key(model: ModelSpec, options: TrainingOptions, hardware: HardwareSpec | None = None) -> str:
    """Where EP overlap is set for this model's recipe: ``comm_overlap.*`` overwrites the model
    field at start-up when the recipe has a CommOverlapConfig (comm_overlap.py:438, 604-619);
    without one, runtime_config_update never calls it (config.py:1883) and the model field
    (MCore TransformerConfig.overlap_moe_expert_parallel_comm) is what runs."""
    if not recipe_has_comm_overlap(recipe_name(model, options, hardware)):
        return "model.overlap_moe_expert_parallel_comm"
    return "comm_overlap.overlap_moe_expert_parallel_comm"


MIXED_PRECISION = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8-tensorwise": "bf16_with_fp8_current_scaling_mixed",
    "fp8-delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
PRECISION_OF_MIXED = {v: k for k, v in MIXED_PRECISION.items()} | {
    v.replace("_", "-"): k for k, v in MIXED_PRECISION.items()
}
# The fields of Bridge's MixedPrecisionConfig that decide precision, as its registered configs set
# them (megatron/bridge/training/mixed_precision.py, megatron-bridge 0.6.2; the dtype fields stay
# the recipe's BF16 ones). Written out field by field because a registered *name* always brings
# ``grad_reduce_in_fp32=True`` (bf16_mixed), which ``MixedPrecisionConfig.setup`` copies onto
# ``ddp.grad_reduce_in_fp32`` at start-up, overriding any ``ddp.*`` override: a BF16 gradient
# buffer survives only as a field of the recipe's own config object.
MIXED_PRECISION_DEFAULTS: dict[str, Any] = {
    "fp32": False,
    "fp16": False,
    "bf16": True,
    "autocast_enabled": False,
    "grad_reduce_in_fp32": True,
    "fp8": None,
    "fp8_recipe": "tensorwise",
    "first_last_layers_bf16": False,
    "fp8_margin": 0,
    "fp8_amax_history_len": 1,
    "fp8_amax_compute_algo": "most_recent",
    "fp8_wgrad": True,
    "fp8_dot_product_attention": False,
    "fp8_multi_head_attention": False,
    "fp8_param": False,
    "fp8_param_gather": False,
    "fp4": None,
    "fp4_recipe": "nvfp4",
    "fp4_param": False,
    "fp4_param_gather": False,
    "num_layers_at_start_in_bf16": 0,
    "num_layers_at_end_in_bf16": 0,
    "reuse_grad_buf_for_mxfp8_param_ag": False,
}
MIXED_PRECISION_FIELDS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8-tensorwise": {
        "fp8": "hybrid",
        "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 1,
        "num_layers_at_end_in_bf16": 1,
    },
    "fp8-delayed": {
        "fp8": "hybrid",
        "fp8_recipe": "delayed",
        "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max",
    },
    "fp8-blockwise": {"fp8": "hybrid", "fp8_recipe": "blockwise"},
    "mxfp8": {"fp8": "e4m3", "fp8_recipe": "mxfp8"},
    "nvfp4": {"fp4": "e2m1"},
}


def keeps_bf16_grad_buffer(recipe: str) -> bool:
    """Whether lcmoe's overrides can give this recipe's run a BF16 DDP gradient buffer: only a
    recipe holding a MixedPrecisionConfig object (``catalog/bridge_recipes.yaml``); a registered
    name reduces gradients in FP32 (a registered name always brings ``grad_reduce_in_fp32=True``)."""
    return recipe in recipe_table().mixed_precision_object


def mixed_precision_fields(options: TrainingOptions) -> dict[str, Any]:
    """Every precision field of Bridge's MixedPrecisionConfig for ``options``: the registered
    config's (``MIXED_PRECISION_FIELDS``), the gradient buffer's dtype and whether the parameters
    are quantized (``TrainingOptions.quantized_params``; mxfp8 then reuses the gradient buffer for
    the parameter all-gather, which Bridge requires, config.py:1491-1495)."""
    fields = MIXED_PRECISION_DEFAULTS | MIXED_PRECISION_FIELDS[options.precision]
    fields["grad_reduce_in_fp32"] = options.main_grads_dtype == "fp32"
    quantized = options.quantized_params
    if options.precision == "nvfp4":
        fields.update(fp4_param=quantized, fp4_param_gather=quantized)
    elif options.is_fp8:
        fields.update(fp8_param=quantized, fp8_param_gather=quantized)
        fields["reuse_grad_buf_for_mxfp8_param_ag"] = quantized and options.precision == "mxfp8"
    return fields


def precision_of_fields(fields: dict[str, Any]) -> str:
    """The lcmoe precision a MixedPrecisionConfig's fields describe (inverse of
    ``mixed_precision_fields``)."""
    if fields.get("fp4") not in (None, "None", "null"):
        return "nvfp4"
    if fields.get("fp8") in (None, "None", "null"):
        return "fp16" if fields.get("fp16") is True else "bf16"
    return {"delayed": "fp8-delayed", "blockwise": "fp8-blockwise", "mxfp8": "mxfp8"}.get(
        str(fields.get("fp8_recipe", "tensorwise")), "fp8-tensorwise"
    )


def mixed_precision_override(run: RunConfig) -> str | dict[str, Any]:
    """``mixed_precision``: the precision fields merged into the recipe's own config object where it
    holds one (keeps a BF16 gradient buffer and the parameter dtype choice), else the registered
    name (``catalog/bridge_recipes.yaml``; fp16 always by name, its dtypes differ)."""
    opt = run.options
    if opt.precision == "fp16" or not keeps_bf16_grad_buffer(recipe_name(run.model, opt, run.hardware)):
        return MIXED_PRECISION[opt.precision]
    return mixed_precision_fields(opt)


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
    if lay.cp > 1:
        out["model.cp_comm_type"] = lay.cp_comm_type
        if lay.hierarchical_context_parallel_sizes:  # a2a+p2p only (config.py:1543-1557)
            out["model.hierarchical_context_parallel_sizes"] = list(lay.hierarchical_context_parallel_sizes)
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
    # Every recompute field is written, so nothing a recipe set survives: Bridge's EP-overlap
    # setup refuses a leftover "moe" module, method or layer count even when granularity is None
    # (comm_overlap.py:498-511; the Qwen3-Next recipe sets [layernorm, moe, moe_act]).
    if opt.recompute_granularity == "full":
        out["model.recompute_granularity"] = "full"
        out["model.recompute_method"] = opt.recompute_method
        out["model.recompute_num_layers"] = opt.recompute_num_layers
        out["model.recompute_modules"] = []
    else:
        selective = opt.recompute_granularity == "selective"
        out["model.recompute_granularity"] = "selective" if selective else None
        out["model.recompute_modules"] = sorted(opt.recompute_modules) if selective else []
        out["model.recompute_method"] = None
        out["model.recompute_num_layers"] = None
    if run.model.is_moe:
        if opt.dispatcher in ("deepep", "hybridep"):
            out["model.moe_token_dispatcher_type"] = "flex"
            out["model.moe_flex_dispatcher_backend"] = opt.dispatcher
        else:
            out["model.moe_token_dispatcher_type"] = opt.dispatcher
        out[ep_overlap_key(run.model, opt, run.hardware)] = opt.overlap_moe_expert_parallel_comm
        # LatentMoE refuses shared-expert overlap in training (moe_layer.py:476-487).
        if opt.overlap_moe_expert_parallel_comm or run.model.moe_latent_size:
            out["model.moe_shared_expert_overlap"] = False
    if opt.cuda_graph_scope:
        if "full_iteration" in opt.cuda_graph_scope:
            out["model.cuda_graph_impl"] = "local"
            out["model.cuda_graph_scope"] = ["full_iteration"]
            out["rerun_state_machine.check_for_nan_in_loss"] = False
        else:
            out["model.cuda_graph_impl"] = "transformer_engine"
            out["model.cuda_graph_scope"] = sorted(opt.cuda_graph_scope)
        out["model.use_te_rng_tracker"] = True
        out["rng.te_rng_tracker"] = True
    else:
        out["model.cuda_graph_impl"] = "none"
    out["ddp.use_distributed_optimizer"] = opt.distributed_optimizer
    out["optimizer.use_distributed_optimizer"] = opt.distributed_optimizer
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
    if opt.doc_lengths is not None:
        # One attention mask per document: GPTDataset returns cu_seqlens of the document
        # boundaries inside each sample (mcore datasets/gpt_dataset.py:80-82, 287-333), which
        # Bridge's GPTDatasetConfig inherits.
        out["dataset.inter_document_masking"] = True
    if opt.is_lora:
        # The PEFT recipe (``recipe_for``) builds cfg.peft = LoRA(); these set its fields (peft/lora.py).
        out["peft.dim"] = opt.lora_rank
        out["peft.target_modules"] = sorted(opt.lora_targets)
        out["peft.sequence_parallel_input_regather"] = opt.lora_input_regather
    return out


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested YAML mapping → dotted keys (``model: {tensor_model_parallel_size: 2}`` →
    ``model.tensor_model_parallel_size``)."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and not str(key).startswith("_"):
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def _get(values: dict[str, Any], key: str, default: Any = None) -> Any:
    value = values.get(key, default)
    return default if value is None or value in ("None", "null") else value


def _int(values: dict[str, Any], key: str, default: int) -> int:
    value = _get(values, key, default)
    if value is None:
        return default
    return whole_number(value, field=key, fix="fix the override")


def _flag(values: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean field: true or false only. A quoted ``"false"`` is text, and ``bool("false")``
    is True, so any other value is refused rather than coerced (issue #31)."""
    value = _get(values, key, default)
    if isinstance(value, bool):
        return value
    raise LcmoeError(key, value, "must be true or false", f"write {key}=true or {key}=false, unquoted")


def _choice(values: dict[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    """An enum field: one of ``allowed`` (never silently replaced by a default)."""
    value = _get(values, key, default)
    if not isinstance(value, str) or value not in allowed:
        raise LcmoeError(key, value, f"must be one of {', '.join(allowed)}", f"e.g. {key}={allowed[0]}")
    return value


def _list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [v for v in str(value).strip("[]").replace(",", " ").replace("'", " ").replace('"', " ").split() if v]


def run_from_overrides(
    values: dict[str, Any],
    *,
    model: ModelSpec,
    hardware: HardwareSpec,
    num_gpus: int,
    seq_len: int | None = None,
    doc_lengths: DocLengths | None = None,
) -> RunConfig:
    """The run a set of Bridge overrides (or a flattened YAML dump) describes. ``doc_lengths``:
    the documents a packing config (``dataset.inter_document_masking`` or offline packing) packs;
    unset there, ``unknown_lengths``."""
    tp = _int(values, "model.tensor_model_parallel_size", 1)
    pp = _int(values, "model.pipeline_model_parallel_size", 1)
    cp = _int(values, "model.context_parallel_size", 1)
    seq = _int(values, "model.seq_length", seq_len or 4096)
    dataset_seq = _get(values, "dataset.seq_length")
    if dataset_seq is not None and whole_number(dataset_seq, field="dataset.seq_length") != seq:
        raise LcmoeError(
            "dataset.seq_length",
            dataset_seq,
            f"must equal model.seq_length = {seq} (Bridge config.py:1644-1648)",
            "set both to the same value",
        )
    layout_text = _get(values, "model.pipeline_model_parallel_layout")
    vpp = _get(values, "model.virtual_pipeline_model_parallel_size")
    if vpp is None and layout_text:
        from lcmoe.layout import parse_pipeline_layout

        vpp = max(len(parse_pipeline_layout(_layout_text(layout_text) or "")) // max(pp, 1), 1)
    dp = derive_dp(num_gpus, tp=tp, cp=cp, pp=pp)
    ep = _int(values, "model.expert_model_parallel_size", 1)
    cp_comm_type = _cp_comm_type(values, cp)
    layout = ParallelLayout(
        tp=tp,
        pp=pp,
        cp=cp,
        vpp=whole_number(vpp or 1, field="model.virtual_pipeline_model_parallel_size"),
        dp=dp,
        ep=ep,
        etp=_int(values, "model.expert_tensor_parallel_size", 1 if ep > 1 else tp),
        mbs=_int(values, "train.micro_batch_size", 1),
        gbs=_int(values, "train.global_batch_size", dp),
        sequence_parallel=_flag(values, "model.sequence_parallel", tp > 1) and tp > 1,
        cp_comm_type=cp_comm_type,
        hierarchical_context_parallel_sizes=read_hierarchical_sizes(
            _get(values, "model.hierarchical_context_parallel_sizes"),
            field="model.hierarchical_context_parallel_sizes",
            cp_comm_type=cp_comm_type,
        ),
        pipeline_layout=_layout_text(layout_text),
    )
    precision, fields = _read_mixed_precision(values)
    granularity = _get(values, "model.recompute_granularity")
    if granularity is not None and granularity not in ("selective", "full", "none"):
        raise LcmoeError(
            "model.recompute_granularity", granularity, "must be selective, full or null", "e.g. selective"
        )
    method = _choice(values, "model.recompute_method", "uniform", ("uniform", "block"))
    modules = _list(_get(values, "model.recompute_modules")) or (["core_attn"] if granularity == "selective" else [])
    # A dense model dispatches nothing, whatever its recipe's (unused) dispatcher field says.
    kind = (
        _choice(values, "model.moe_token_dispatcher_type", "alltoall", ("alltoall", "allgather", "flex"))
        if model.is_moe
        else "alltoall"
    )
    dispatcher = (
        _choice(values, "model.moe_flex_dispatcher_backend", "deepep", ("deepep", "hybridep"))
        if kind == "flex"
        else kind
    )
    impl = str(_get(values, "model.cuda_graph_impl", "none"))
    scopes = frozenset(_graph_modules(values)) if impl != "none" else frozenset()
    if impl == "full_iteration" or (impl == "local" and not scopes):
        # Megatron-Core 0.19 names the local full-iteration graph cuda_graph_impl=full_iteration.
        scopes = frozenset({"full_iteration"})
    aware = _flag(values, "optimizer.use_precision_aware_optimizer", False)
    offload_key = "optimizer.optimizer_offload_fraction"
    offload = (
        real_number(_get(values, offload_key, 1.0), field=offload_key)
        if _flag(values, "optimizer.optimizer_cpu_offload", False)
        else 0.0
    )
    options = TrainingOptions(
        seq_len=seq,
        precision=precision,
        recompute_granularity=granularity if granularity in ("selective", "full") else "none",
        recompute_modules=frozenset(modules) if granularity == "selective" else frozenset(),
        recompute_method="block" if method == "block" else "uniform",
        recompute_num_layers=_int(values, "model.recompute_num_layers", 1),
        dispatcher=dispatcher,
        cuda_graph_scope=scopes,
        overlap_moe_expert_parallel_comm=(
            _flag(values, "comm_overlap.overlap_moe_expert_parallel_comm", False)
            or _flag(values, "model.overlap_moe_expert_parallel_comm", False)
        ),
        distributed_optimizer=_flag(values, "ddp.use_distributed_optimizer", True),
        fp8_param_gather=_quantized_params(precision, fields),
        main_grads_dtype=_gradient_buffer_dtype(values, fields, aware=aware),
        precision_aware=aware,
        exp_avg_dtype="bf16" if aware and _get(values, "optimizer.exp_avg_dtype", "bf16") == "bf16" else "fp32",
        main_params_dtype=_sixteen_bit(_get(values, "optimizer.main_params_dtype", "fp32")) if aware else "fp32",
        optimizer_offload_fraction=offload,
        doc_lengths=packed_doc_lengths(
            _flag(values, "dataset.inter_document_masking", False)
            or _flag(values, "dataset.enable_offline_packing", False),
            doc_lengths,
            seq,
            config_key="dataset.inter_document_masking",
        ),
        **_peft_fields(values),
        **bridge_offload_options(values, _list(_get(values, "model.offload_modules"))),
    )
    return RunConfig(model, hardware, layout, options)


def packed_doc_lengths(packed: bool, given: DocLengths | None, seq_len: int, *, config_key: str) -> DocLengths | None:
    """The documents of a read-back config: ``given`` (``--doc-lengths``) or ``unknown_lengths``
    when the config packs documents, None when it does not (a ``--doc-lengths`` then is an error)."""
    if packed:
        return given if given is not None else unknown_lengths(seq_len)
    if given is not None:
        raise LcmoeError(
            "--doc-lengths",
            given.name,
            f"is given but the config packs no documents ({config_key} is not set)",
            f"set {config_key} or drop --doc-lengths",
        )
    return None


def _layout_text(value: Any) -> str | None:
    """``model.pipeline_model_parallel_layout`` as the string lcmoe parses (bounded there)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise LcmoeError(
            "model.pipeline_model_parallel_layout", value, "must be a layout string", "e.g. Et*3|t*4|t*4|t*3mL"
        )
    return value


def _cp_comm_type(values: dict[str, Any], cp: int) -> str:
    """``model.cp_comm_type`` (Megatron-Core also accepts ``allgather``, transformer_config.py);
    without CP it is unused, whatever a recipe left there (GLM-5.2's say allgather)."""
    if cp == 1:
        return "p2p"
    kind = str(_get(values, "model.cp_comm_type", "p2p"))
    return "all_gather" if kind.replace("_", "").lower() == "allgather" else kind


def _graph_modules(values: dict[str, Any]) -> list[str]:
    """The graphed modules: ``model.cuda_graph_scope`` as lcmoe and older configs write it, or
    ``model.cuda_graph_modules``, where Megatron-Core 0.19 moves it (a config Bridge saves lists
    CudaGraphModule entries as ``{_name_: attn, …}`` mappings)."""
    given = _get(values, "model.cuda_graph_scope") or _get(values, "model.cuda_graph_modules")
    if isinstance(given, list | tuple):
        return [str(item.get("_name_", "")) if isinstance(item, dict) else str(item) for item in given]
    return _list(given)


def _read_mixed_precision(values: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(precision, the MixedPrecisionConfig fields given): ``mixed_precision`` as a registered
    name (fields None), as ``{k:v,…}`` fields (an override) or as ``mixed_precision.<field>``
    keys (a flattened YAML mapping); absent, the recipe's BF16."""
    given = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("mixed_precision.")}
    value = _get(values, "mixed_precision")
    if isinstance(value, str) and value.strip().startswith("{"):
        value = _parse_fields(value)
    if isinstance(value, dict):
        given = {**value, **given}
    elif value is not None:
        precision = PRECISION_OF_MIXED.get(str(value))
        if precision is None:
            raise LcmoeError(
                "mixed_precision",
                value,
                "is not a registered Bridge precision recipe",
                f"use one of {', '.join(sorted(MIXED_PRECISION.values()))}",
            )
        return precision, None
    if not given:
        return "bf16", None
    return precision_of_fields(given), given


def _quantized_params(precision: str, fields: dict[str, Any] | None) -> bool | None:
    """Quantized parameters as the given fields set them (``fp4_param_gather`` under NVFP4,
    ``fp8_param_gather`` under FP8); None (the registered config's choice) when not given."""
    key = "fp4_param_gather" if precision == "nvfp4" else "fp8_param_gather"
    if fields is None or key not in fields or precision in ("bf16", "fp16"):
        return None
    return fields[key] not in (False, "false", "False", None)


def parse_override_lines(text: str) -> dict[str, Any]:
    """``KEY=VALUE`` lines (``overrides.txt``, ``#`` comments) as Hydra reads their values, the
    inverse of ``format_override_value``: YAML scalars and lists, and ``{k:v,…}`` dictionaries,
    which YAML would read as keys "k:v" without values. A leading ``+`` (append) is dropped; a
    value YAML cannot read stays text. At most MAX_OVERRIDE_LINES lines of at most
    MAX_OVERRIDE_CHARS characters each (bounded work, issue #31)."""
    values: dict[str, Any] = {}
    count = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        count += 1
        if count > MAX_OVERRIDE_LINES:
            raise LcmoeError(
                "overrides",
                f"{count:,}+ lines",
                f"are more than {MAX_OVERRIDE_LINES:,}",
                "pass the run's overrides only",
            )
        key, _, raw = line.partition("=")
        key, raw = key.strip().lstrip("+"), raw.strip()
        if len(raw) > MAX_OVERRIDE_CHARS:
            raise LcmoeError(key, raw, f"is longer than {MAX_OVERRIDE_CHARS:,} characters", "check the value")
        if raw.startswith("{"):
            values[key] = _parse_fields(raw)
            continue
        values[key] = _override_scalar(raw, key) if raw else None
    return values


# A Bridge config has ~1,500 fields and its longest value (a pipeline layout of 128 stages)
# is < 2,000 characters: these bounds are ~10× that.
MAX_OVERRIDE_LINES = 20_000
MAX_OVERRIDE_CHARS = 20_000


def _override_scalar(raw: str, key: str) -> Any:
    """One override value read as YAML (bounded: safe_io.load_yaml); text when YAML cannot read
    it, but a number too long for any field is refused outright."""
    from lcmoe.safe_io import check_int_literals, load_yaml

    check_int_literals(raw, origin=key)
    try:
        return load_yaml(raw, origin=key)
    except LcmoeError:
        return raw


def _parse_fields(text: str) -> dict[str, Any]:
    """Hydra's ``{k:v,…}`` (flat, as ``format_override_value`` writes it) as a dict."""
    from lcmoe.safe_io import load_yaml

    out: dict[str, Any] = {}
    for item in text.strip().strip("{}").split(","):
        key, sep, raw = item.partition(":")
        if not sep:
            raise LcmoeError(
                "mixed_precision", text, "is not a {key:value,…} mapping", "write mixed_precision={fp8:hybrid,…}"
            )
        out[key.strip()] = load_yaml(raw.strip(), origin=f"mixed_precision.{key.strip()}") if raw.strip() else None
    return out


def _gradient_buffer_dtype(
    values: dict[str, Any], fields: dict[str, Any] | None, *, aware: bool
) -> Literal["fp32", "bf16"]:
    """The DDP gradient buffer's dtype. ``MixedPrecisionConfig.setup`` copies the mixed-precision
    config's ``grad_reduce_in_fp32`` onto ``ddp`` at start-up, so that field decides when it is
    given, and a registered name decides by its own (FP32 but for fp16_mixed); otherwise the
    ``ddp`` override (perf recipes: False, facts §2) or a precision-aware optimizer's BF16 main
    grads."""
    falsy = (False, "false", "False")
    if fields is not None and "grad_reduce_in_fp32" in fields:
        return "bf16" if fields["grad_reduce_in_fp32"] in falsy else "fp32"
    named = _get(values, "mixed_precision")
    if isinstance(named, str) and named in PRECISION_OF_MIXED:
        return "bf16" if PRECISION_OF_MIXED[named] == "fp16" else "fp32"
    if _get(values, "ddp.grad_reduce_in_fp32", True) in falsy:
        return "bf16"
    return "bf16" if aware and _get(values, "optimizer.main_grads_dtype", "bf16") == "bf16" else "fp32"


def _peft_fields(values: dict[str, Any]) -> dict[str, Any]:
    """LoRA from ``peft.*`` keys (or ``peft: lora``); {} for full training. DoRA is refused:
    its magnitude vectors and weight-norm activations are not modelled."""
    scheme = str(_get(values, "peft", "") or "").lower()
    keys = [k for k in values if k.startswith("peft.")]
    if "dora" in scheme or "dora" in str(_get(values, "peft._target_", "")).lower():
        raise LcmoeError("peft", "dora", "is not modelled (LoRA is)", "estimate the run as LoRA for a lower bound")
    if not keys and scheme not in ("lora", "megatron.bridge.peft.lora.lora"):
        return {}
    targets = _list(_get(values, "peft.target_modules")) or LORA_TARGETS
    return lora_fields(
        _int(values, "peft.dim", 32), targets, _flag(values, "peft.sequence_parallel_input_regather", False)
    )


def _sixteen_bit(value: Any) -> Literal["fp32", "fp16", "bf16"]:
    """A Bridge dtype spelling (torch.float16, float16, fp16, bf16, torch.bfloat16, ...) as lcmoe's."""
    text = str(value).lower()
    if "bf16" in text or "bfloat16" in text:
        return "bf16"
    return "fp16" if "16" in text else "fp32"


def format_override_value(value: Any) -> str:
    """Hydra/OmegaConf spelling: null, true/false, [a,b] lists, {k:v,…} dictionaries, plain numbers
    and strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_override_value(v)}" for k, v in value.items()) + "}"
    return str(value)
