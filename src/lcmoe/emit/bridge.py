"""Megatron Bridge outputs for a plan: overrides, a YAML config and a Python snippet that edits a
``ConfigContainer``. Field paths and quirks: lcmoe.config_io.bridge."""

from __future__ import annotations

from typing import Any

import yaml

from lcmoe.config_io.bridge import format_override_value, override_key, overrides_from_run
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


def python_snippet(run: RunConfig, recipe: str) -> str:
    lines = [
        "# Apply the lcmoe plan to a Megatron Bridge ConfigContainer.",
        f"from megatron.bridge.recipes import {recipe.rsplit('.', 1)[-1]} as recipe_fn  # adjust the import",
        "",
        "cfg = recipe_fn()",
    ]
    for key, value in overrides_from_run(run).items():
        if isinstance(value, dict):  # fields of the recipe's own config object (mixed_precision)
            lines += [f"cfg.{key}.{field} = {item!r}" for field, item in value.items()]
            continue
        lines.append(f"cfg.{key} = {value!r}")
    return "\n".join(lines) + "\n"
