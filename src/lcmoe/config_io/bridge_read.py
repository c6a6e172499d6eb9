"""The run a set of Megatron Bridge overrides (or a flattened YAML dump) describes
(``run_from_overrides``)."""

from __future__ import annotations

from typing import Any, Literal

from lcmoe.config_io.activation_offload import bridge_offload_options
from lcmoe.config_io.bridge_precision import MIXED_PRECISION, PRECISION_OF_MIXED, precision_of_fields
from lcmoe.config_io.bridge_syntax import parse_fields
from lcmoe.config_io.dynamic_cp import bridge_dynamic_cp_options
from lcmoe.config_io.paged_stash import bridge_stash_options
from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, read_hierarchical_sizes
from lcmoe.run import RunConfig, derive_dp
from lcmoe.specs.doc_lengths import DocLengths, unknown_lengths
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.units import real_number, whole_number
from lcmoe.workload import LORA_TARGETS, TrainingOptions, lora_fields


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
    # Read in this order, field by field, so that of several bad fields the same one is reported.
    tp = _int(values, "model.tensor_model_parallel_size", 1)
    pp = _int(values, "model.pipeline_model_parallel_size", 1)
    cp = _int(values, "model.context_parallel_size", 1)
    seq = _seq_len(values, seq_len)
    layout = _layout_from_values(values, num_gpus, tp=tp, pp=pp, cp=cp)
    precision, fields = _read_mixed_precision(values)
    recompute = _recompute_fields(values)
    dispatcher = _dispatcher(values, model)
    scopes = _graph_scopes(values)
    aware = _flag(values, "optimizer.use_precision_aware_optimizer", False)
    offload = _offload_fraction(values)
    options = TrainingOptions(
        seq_len=seq,
        precision=precision,
        **recompute,
        recompute_num_layers=_int(values, "model.recompute_num_layers", 1),
        dispatcher=dispatcher,
        cuda_graph_scope=scopes,
        overlap_moe_expert_parallel_comm=(
            _flag(values, "comm_overlap.overlap_moe_expert_parallel_comm", False)
            or _flag(values, "model.overlap_moe_expert_parallel_comm", False)
        ),
        delay_wgrad_compute=(
            _flag(values, "comm_overlap.delay_wgrad_compute", False)
            or _flag(values, "model.delay_wgrad_compute", False)
        ),
        **_optimizer_fields(values),
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
        **bridge_dynamic_cp_options(values),
        **bridge_stash_options(values),
    )
    return RunConfig(model, hardware, layout, options)


def _seq_len(values: dict[str, Any], seq_len: int | None) -> int:
    """``model.seq_length`` (else ``seq_len``, else 4096), which ``dataset.seq_length`` must equal."""
    seq = _int(values, "model.seq_length", seq_len or 4096)
    dataset_seq = _get(values, "dataset.seq_length")
    if dataset_seq is not None and whole_number(dataset_seq, field="dataset.seq_length") != seq:
        raise LcmoeError(
            "dataset.seq_length",
            dataset_seq,
            f"must equal model.seq_length = {seq} (Bridge config.py:1644-1648)",
            "set both to the same value",
        )
    return seq


def _layout_from_values(values: dict[str, Any], num_gpus: int, *, tp: int, pp: int, cp: int) -> ParallelLayout:
    """The parallel layout the ``model.*`` and ``train.*`` fields set; VPP, when not given, from
    the pipeline layout's stage count."""
    layout_text = _get(values, "model.pipeline_model_parallel_layout")
    vpp = _get(values, "model.virtual_pipeline_model_parallel_size")
    if vpp is None and layout_text:
        from lcmoe.layout import parse_pipeline_layout

        vpp = max(len(parse_pipeline_layout(_layout_text(layout_text) or "")) // max(pp, 1), 1)
    dp = derive_dp(num_gpus, tp=tp, cp=cp, pp=pp)
    ep = _int(values, "model.expert_model_parallel_size", 1)
    cp_comm_type = _cp_comm_type(values, cp)
    return ParallelLayout(
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


def _recompute_fields(values: dict[str, Any]) -> dict[str, Any]:
    """TrainingOptions' recompute granularity, modules and method from ``model.recompute_*``."""
    granularity = _get(values, "model.recompute_granularity")
    if granularity is not None and granularity not in ("selective", "full", "none"):
        raise LcmoeError(
            "model.recompute_granularity", granularity, "must be selective, full or null", "e.g. selective"
        )
    method = _choice(values, "model.recompute_method", "uniform", ("uniform", "block"))
    modules = _list(_get(values, "model.recompute_modules")) or (["core_attn"] if granularity == "selective" else [])
    return {
        "recompute_granularity": granularity if granularity in ("selective", "full") else "none",
        "recompute_modules": frozenset(modules) if granularity == "selective" else frozenset(),
        "recompute_method": "block" if method == "block" else "uniform",
    }


def _dispatcher(values: dict[str, Any], model: ModelSpec) -> str:
    """lcmoe's dispatcher: the flex backend under ``flex``. A dense model dispatches nothing,
    whatever its recipe's (unused) dispatcher field says."""
    kind = (
        _choice(values, "model.moe_token_dispatcher_type", "alltoall", ("alltoall", "allgather", "flex"))
        if model.is_moe
        else "alltoall"
    )
    if kind == "flex":
        return _choice(values, "model.moe_flex_dispatcher_backend", "deepep", ("deepep", "hybridep"))
    return kind


def _graph_scopes(values: dict[str, Any]) -> frozenset[str]:
    """The CUDA-graphed scopes; none when ``model.cuda_graph_impl`` is none."""
    impl = str(_get(values, "model.cuda_graph_impl", "none"))
    scopes = frozenset(_graph_modules(values)) if impl != "none" else frozenset()
    if impl == "full_iteration" or (impl == "local" and not scopes):
        # Megatron-Core 0.19 names the local full-iteration graph cuda_graph_impl=full_iteration.
        scopes = frozenset({"full_iteration"})
    return scopes


def _offload_fraction(values: dict[str, Any]) -> float:
    """The optimizer state's share on the host: ``optimizer.optimizer_offload_fraction`` (default
    1.0) when ``optimizer.optimizer_cpu_offload`` is on, else 0."""
    if not _flag(values, "optimizer.optimizer_cpu_offload", False):
        return 0.0
    offload_key = "optimizer.optimizer_offload_fraction"
    return real_number(_get(values, offload_key, 1.0), field=offload_key)


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
        value = parse_fields(value)
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


def _optimizer_fields(values: dict[str, Any]) -> dict[str, Any]:
    """optimizer, distributed_optimizer and the Muon fields: ``optimizer.optimizer`` ``muon`` or
    ``dist_muon`` (the layer-wise distributed optimizer, Bridge optim.py:95-110; Megatron-Core
    also reads ``optimizer.use_layer_wise_distributed_optimizer``, optimizer/__init__.py:742-754),
    else Adam (SGD as written) with ``ddp.use_distributed_optimizer``."""
    name = str(_get(values, "optimizer.optimizer", "adam"))
    distributed = _flag(values, "ddp.use_distributed_optimizer", True)
    if name not in ("muon", "dist_muon"):
        return {"optimizer": "sgd" if name == "sgd" else "adam", "distributed_optimizer": distributed}
    layer_wise = name == "dist_muon" or _flag(values, "optimizer.use_layer_wise_distributed_optimizer", False)
    return {
        "optimizer": "muon",
        "distributed_optimizer": layer_wise,
        "muon_num_ns_steps": _int(values, "optimizer.muon_num_ns_steps", 5),
        "muon_tp_mode": str(_get(values, "optimizer.muon_tp_mode", "blockwise")),
    }


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
