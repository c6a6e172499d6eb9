"""Fine-grained activation offloading rules (Megatron-Core ``fine_grained_activation_offloading``
with ``offload_modules``): what ``TransformerConfig.__post_init__`` refuses with it.

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2 ``transformer/
transformer_config.py`` (``mcore``) and megatron-bridge 0.6.2 ``training/config.py``
(``bridge``). The rules lcmoe's options cannot break are kept out of the table and named here:
the module names (``TrainingOptions`` refuses unknown ones, mcore :1854-1867), a non-empty list
(lcmoe turns the feature on only with modules, :1852), the fraction's range (a
``TrainingOptions`` fraction, :1888-1890), ``fused_group_mlp`` (not offered, :1895-1903), layer-level
``cpu_offloading`` (:1848-1851; lcmoe never emits it, and ``check`` refuses a config that sets
both: ``config_io.activation_offload``), ``moe_paged_stash`` (:1904-1921, ``rules.paged_stash`` L-STASH-OFFLOAD) and the
ncclep dispatcher (:2729-2735, not an lcmoe dispatcher). Bridge's own gate (bridge
config.py:2046-2051: ``transformer_impl="transformer_engine"``) holds for every lcmoe config, and
its TE ≥ 2.10 gate (:2053-2059: ``NVTE_CPU_OFFLOAD_V1=1``) is met by the emitted environment
(``emit.environment``).
"""

from __future__ import annotations

from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig

# Offload modules inside the routed experts: a recomputed ``moe`` block checkpoints them whole.
EXPERT_OFFLOAD_MODULES = frozenset({"expert_fc1", "moe_act"})
# CUDA-graph scopes Megatron-Core refuses with fine-grained offloading: ``moe`` (token-drop MoE,
# mcore :2631-2633) and ``full_iteration``, which needs fine_grained_offloading_max_inflight_offloads
# (:2634-2640), a knob lcmoe neither models nor emits.
OFFLOAD_REFUSED_GRAPH_SCOPES = frozenset({"moe", "full_iteration"})


def _attn_proj_alone(r: RunConfig) -> str | None:
    mods = r.options.activation_offload_modules
    if "attn_proj" in mods and "core_attn" not in mods:
        return "offloading attn_proj needs core_attn offloaded too (attn_proj's input is core_attn's output)"
    return None


def _expert_offload_moe_recompute(r: RunConfig) -> str | None:
    o = r.options
    inside = EXPERT_OFFLOAD_MODULES & o.activation_offload_modules
    if inside and o.recompute_granularity == "selective" and "moe" in o.recompute_modules:
        return f"offloading {', '.join(sorted(inside))} while recomputing the whole MoE block (moe)"
    return None


def _offload_graphs(r: RunConfig) -> str | None:
    o = r.options
    refused = OFFLOAD_REFUSED_GRAPH_SCOPES & o.cuda_graph_scope
    if o.activation_offload_modules and refused:
        return f"fine-grained activation offloading with the {', '.join(sorted(refused))} CUDA-graph scope"
    return None


AOFF_ATTN_PROJ = LegalityRule(
    "L-AOFF-ATTN-PROJ",
    "mcore transformer_config.py:1868-1873",
    "offload core_attn with attn_proj, or drop attn_proj",
    _attn_proj_alone,
)
AOFF_MOE_RECOMPUTE = LegalityRule(
    "L-AOFF-MOE-RECOMPUTE",
    "mcore transformer_config.py:1874-1884",
    "drop moe from the recompute modules or expert_fc1 / moe_act from the offload modules",
    _expert_offload_moe_recompute,
)
AOFF_GRAPHS = LegalityRule(
    "L-AOFF-GRAPHS",
    "mcore transformer_config.py:2596-2640 (offloading only with the transformer_engine graph implementation "
    "or a local partial-MoE graph; not with the moe scope)",
    "use TE-scoped graphs (attn, mlp, moe_router) or drop the offload modules",
    _offload_graphs,
)
ACTIVATION_OFFLOAD_RULES = (AOFF_ATTN_PROJ, AOFF_MOE_RECOMPUTE, AOFF_GRAPHS)
