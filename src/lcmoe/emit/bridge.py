"""Megatron Bridge outputs for a plan: overrides, a YAML config and a Python snippet that edits a
``ConfigContainer``. Field paths and quirks: lcmoe.config_io.bridge_write, bridge_read, bridge_syntax."""

from __future__ import annotations

from typing import Any

import yaml

from lcmoe.config_io.bridge import format_override_value, override_key, overrides_from_run
from lcmoe.emit.syntax import python_identifier, python_literal
from lcmoe.run import RunConfig


def overrides_text(run: RunConfig) -> str:
    return "\n".join(f"{override_key(k)}={format_override_value(v)}" for k, v in overrides_from_run(run).items()) + "\n"


def yaml_config(run: RunConfig) -> str:
    nested: dict[str, Any] = {}
    for key, value in overrides_from_run(run).items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(nested, sort_keys=False)


# Megatron-Core's OptimizerConfig holds dtypes as torch.dtype (optimizer_config.py: main_grads_dtype,
# exp_avg_dtype, exp_avg_sq_dtype, main_params_dtype; FP8 moments are torch.uint8).
TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.uint8"}
DTYPE_FIELDS = frozenset(
    {
        "optimizer.main_grads_dtype",
        "optimizer.exp_avg_dtype",
        "optimizer.exp_avg_sq_dtype",
        "optimizer.main_params_dtype",
    }
)


def python_snippet(run: RunConfig, recipe: str | None) -> str:
    """``apply_plan.py``: build the recipe's ConfigContainer and set every planned field on it
    (values as Python literals; dtype fields as ``torch`` dtypes). ``recipe`` None: Bridge ships
    none for the model, and the script says so when run."""
    lines = ["# Apply the lcmoe plan to a Megatron Bridge ConfigContainer.", "import torch", ""]
    if recipe is None:
        lines += [
            "# Megatron Bridge ships no recipe for this model: build cfg from a recipe of the same family,",
            "# with the model from its Hugging Face checkpoint:",
            "# AutoBridge.from_hf_pretrained(PATH).to_megatron_provider().",
            "raise SystemExit('no Megatron Bridge recipe for this model: edit apply_plan.py (see the comment above)')",
        ]
    else:
        name = python_identifier("recipe", recipe)
        lines += [f"from megatron.bridge.recipes import {name} as recipe_fn", "", "cfg = recipe_fn()"]
    for key, value in overrides_from_run(run).items():
        python_identifier("field", key.replace(".", "_"))
        if isinstance(value, dict):  # fields of the recipe's own config object (mixed_precision)
            for field, item in value.items():
                python_identifier("field", field)
                lines.append(f"cfg.{key}.{field} = {python_literal(key, item)}")
        elif key in DTYPE_FIELDS:
            lines.append(f"cfg.{key} = {TORCH_DTYPES[value]}")
        else:
            lines.append(f"cfg.{key} = {python_literal(key, value)}")
    return "\n".join(lines) + "\n"
