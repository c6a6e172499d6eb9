"""Megatron Bridge precision: ``mixed_precision`` as a registered recipe name or as the fields of
its ``MixedPrecisionConfig``, and back."""

from __future__ import annotations

from typing import Any

from lcmoe.config_io.bridge_recipes import recipe_name, recipe_table
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions

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
