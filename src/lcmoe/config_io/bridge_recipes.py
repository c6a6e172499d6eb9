"""Megatron Bridge recipes: which recipe a model launches from (``catalog/bridge_recipes.yaml``)
and what it holds, which decides where some fields are set (EP overlap through ``comm_overlap.*``
only where the recipe has a ``CommOverlapConfig``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from lcmoe.errors import LcmoeError
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


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


def ep_overlap_key(model: ModelSpec, options: TrainingOptions, hardware: HardwareSpec | None = None) -> str:
    """Where EP overlap is set for this model's recipe: ``comm_overlap.*`` overwrites the model
    field at start-up when the recipe has a CommOverlapConfig (comm_overlap.py:438, 604-619);
    without one, runtime_config_update never calls it (config.py:1883) and the model field
    (MCore TransformerConfig.overlap_moe_expert_parallel_comm) is what runs."""
    if not recipe_has_comm_overlap(recipe_name(model, options, hardware)):
        return "model.overlap_moe_expert_parallel_comm"
    return "comm_overlap.overlap_moe_expert_parallel_comm"
