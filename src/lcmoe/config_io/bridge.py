"""Megatron Bridge configuration spellings (megatron-bridge-facts.md §1.2–1.4).

Bridge quirks this module encodes: precision goes through ``mixed_precision`` (a registered
recipe name), EP overlap through ``comm_overlap.*`` where the recipe has a ``CommOverlapConfig``
(its ``setup`` rewrites ``model.overlap_moe_expert_parallel_comm`` at start-up) and through the
model field where it has none (``comm_overlap`` is None: a ``comm_overlap.*`` override is refused
by Hydra), dispatcher type and flex backend are set together, an explicit
``model.pipeline_model_parallel_layout`` is written whenever layers do not split evenly, and
``model.seq_length`` must equal ``dataset.seq_length``.
"""

# The Bridge spellings live in modules by concern; this module keeps the names lcmoe and its tests
# import from here.
from lcmoe.config_io.bridge_precision import (
    MIXED_PRECISION,
    MIXED_PRECISION_DEFAULTS,
    MIXED_PRECISION_FIELDS,
    PRECISION_OF_MIXED,
    keeps_bf16_grad_buffer,
    mixed_precision_fields,
    mixed_precision_override,
    precision_of_fields,
)
from lcmoe.config_io.bridge_read import packed_doc_lengths, run_from_overrides
from lcmoe.config_io.bridge_recipes import (
    RecipeTable,
    ep_overlap_key,
    has_recipe,
    peft_recipe_name,
    recipe_for,
    recipe_has_comm_overlap,
    recipe_name,
    recipe_table,
)
from lcmoe.config_io.bridge_syntax import (
    MAX_OVERRIDE_CHARS,
    MAX_OVERRIDE_LINES,
    flatten,
    format_override_value,
    override_key,
    parse_override_lines,
)
from lcmoe.config_io.bridge_write import overrides_from_run

__all__ = [
    "MAX_OVERRIDE_CHARS",
    "MAX_OVERRIDE_LINES",
    "MIXED_PRECISION",
    "MIXED_PRECISION_DEFAULTS",
    "MIXED_PRECISION_FIELDS",
    "PRECISION_OF_MIXED",
    "RecipeTable",
    "ep_overlap_key",
    "flatten",
    "format_override_value",
    "has_recipe",
    "keeps_bf16_grad_buffer",
    "mixed_precision_fields",
    "mixed_precision_override",
    "override_key",
    "overrides_from_run",
    "packed_doc_lengths",
    "parse_override_lines",
    "peft_recipe_name",
    "precision_of_fields",
    "recipe_for",
    "recipe_has_comm_overlap",
    "recipe_name",
    "recipe_table",
    "run_from_overrides",
]
