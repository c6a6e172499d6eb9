"""Hard Megatron constraints as data: each rule has an id, a check, the source (file:line, from
megatron-bridge-facts.md §2) and a concrete fix. ``violations(run)`` returns every broken rule.

A rule's ``check`` returns None when the run is legal, else the sentence saying what is wrong
(with the numbers); the fix says what to change.
"""

from __future__ import annotations

import re

from lcmoe.layout import check_pipeline_layout, layers_split_evenly, pipeline_stages
from lcmoe.rules.activation_offload import ACTIVATION_OFFLOAD_RULES
from lcmoe.rules.context_parallel import CP_A2A_HEADS, CP_HIER_SIZES, CP_HIER_THD, SEQ_CP, SEQ_SP
from lcmoe.rules.delay_wgrad import DELAY_WGRAD_RULES
from lcmoe.rules.dynamic_cp import DYNAMIC_CP_RULES
from lcmoe.rules.megatron_fsdp import FSDP_RULES
from lcmoe.rules.muon import MUON_RULES
from lcmoe.rules.paged_stash import PAGED_STASH_RULES
from lcmoe.rules.records import LegalityRule as LegalityRule
from lcmoe.rules.records import Violation as Violation
from lcmoe.run import RunConfig


def _world(r: RunConfig) -> str | None:
    lay = r.layout
    grid = lay.ep * lay.etp * lay.pp
    if lay.world_size % grid:
        return f"{lay.world_size} GPUs do not fold the expert grid EP·ETP·PP = {lay.ep}·{lay.etp}·{lay.pp} = {grid}"
    return None


def _experts(r: RunConfig) -> str | None:
    experts = r.model.num_moe_experts
    if r.layout.ep > 1 and not experts:
        return f"EP = {r.layout.ep} on a dense model"
    if experts and experts % r.layout.ep:
        return f"{experts} experts do not split over EP = {r.layout.ep}"
    return None


def _heads(r: RunConfig) -> str | None:
    n, tp = r.model.num_attention_heads, r.layout.tp
    if n % tp:
        return f"{n} attention heads do not split over TP = {tp}"
    g = r.model.query_groups
    if not r.model.multi_latent_attention and g % tp and tp % g:
        return f"{g} query groups and TP = {tp}: neither divides the other"
    return None


def _bias_etp(r: RunConfig) -> str | None:
    if r.model.is_moe and (r.model.add_bias_linear or r.model.moe_expert_bias) and r.layout.etp != 1:
        return f"MoE with linear biases needs ETP = 1, got {r.layout.etp}"
    return None


def _gbs(r: RunConfig) -> str | None:
    lay = r.layout
    if lay.gbs % (lay.mbs * lay.dp):
        return f"GBS {lay.gbs} is not a multiple of MBS·DP = {lay.mbs}·{lay.dp} = {lay.mbs * lay.dp}"
    return None


def _vpp(r: RunConfig) -> str | None:
    lay = r.layout
    if lay.vpp > 1:
        if lay.pp == 1:
            return "VPP > 1 needs PP > 1"
        m = lay.num_microbatches
        if m < lay.pp or m % lay.pp:
            return f"with VPP the {m} microbatches per step must be a positive multiple of PP = {lay.pp}"
    return None


def _layers(r: RunConfig) -> str | None:
    lay = r.layout
    if lay.pipeline_layout:
        try:
            check_pipeline_layout(r.model, lay)
        except Exception as exc:  # LcmoeError carries the sentence
            return str(exc)
        return None
    if (lay.pp > 1 or lay.vpp > 1) and not layers_split_evenly(r.model, lay.pp, lay.vpp):
        return f"{r.model.num_layers} layers do not split over PP·VPP = {lay.pp * lay.vpp}"
    return None


def _gdn_cp(r: RunConfig) -> str | None:
    m, lay = r.model, r.layout
    if m.linear_attention_type == "gdn":
        size = lay.tp * lay.cp
        if m.linear_num_key_heads % size or m.linear_num_value_heads % size:
            return (
                f"Gated DeltaNet heads ({m.linear_num_key_heads} key, {m.linear_num_value_heads} value) "
                f"do not split over TP·CP = {size}"
            )
    return None


def _mamba_tp_cp(r: RunConfig) -> str | None:
    m, lay = r.model, r.layout
    if not m.mamba_num_heads:
        return None
    heads, groups = m.mamba_num_heads, m.mamba_num_groups
    if heads % lay.tp or groups % lay.tp:
        return f"Mamba heads ({heads}) and groups ({groups}) do not split over TP = {lay.tp}"
    local_groups = groups // lay.tp
    if (heads // lay.tp) % lay.cp or (local_groups % lay.cp and lay.cp % local_groups):
        return (
            f"Mamba CP needs the {heads // lay.tp} heads per TP rank divisible by CP = {lay.cp} and "
            f"CP and the {local_groups} groups per TP rank to divide one another"
        )
    return None


def _dsa_cp(r: RunConfig) -> str | None:
    lay = r.layout
    if r.model.is_dsa and lay.cp > 1 and lay.cp_comm_type != "all_gather":
        return f"DSA attention with CP = {lay.cp} supports only all_gather CP, not {lay.cp_comm_type}"
    return None


def _dsa_version(r: RunConfig) -> str | None:
    m = r.model
    if m.is_dsa and r.layout.cp > 1:
        return "DSA attention with CP > 1 is refused by this Megatron-Core release"
    if m.shares_dsa_topk:
        return "this Megatron-Core release has no DSA top-k sharing (dsa_indexer_topk_freq)"
    return None


def _dsa_index_sharing(r: RunConfig) -> str | None:
    m = r.model
    if not m.shares_dsa_topk or _layers(r):
        return None
    for stage in pipeline_stages(m, r.layout):
        for chunk in stage.chunks:
            if chunk.decoder_layers and not m.has_dsa_indexer(chunk.decoder_layers[0]):
                first = chunk.decoder_layers[0] + 1
                return (
                    f"a pipeline chunk starts at layer {first}, which reuses an earlier layer's DSA top-k "
                    f"(index_topk_freq {m.dsa_indexer_topk_freq}, offset {m.dsa_indexer_skip_topk_offset}) "
                    "and top-k cannot cross pipeline stages"
                )
    return None


def _hybrid_pipeline(r: RunConfig) -> str | None:
    lay = r.layout
    if r.model.is_hybrid and (lay.vpp > 1 or lay.pipeline_layout):
        return "a hybrid model without '|' stage marks in its pattern splits over PP evenly only, without VPP"
    return None


def _gdn_cp_version(r: RunConfig) -> str | None:
    if r.model.linear_attention_type == "gdn" and r.layout.cp > 1:
        return "Gated DeltaNet with CP > 1 is refused by this Megatron-Core release"
    return None


def _dispatcher_gpu(r: RunConfig) -> str | None:
    if r.options.dispatcher == "deepep" and r.hardware.nvlink_domain_size > 8:
        return f"DeepEP is refused on {r.hardware.name} (NVL72); Bridge allows it on Hopper and B200/B300 only"
    if r.options.dispatcher in ("deepep", "hybridep") and not r.model.is_moe:
        return f"{r.options.dispatcher} dispatcher on a dense model"
    return None


def _offload(r: RunConfig) -> str | None:
    if r.options.optimizer_offload_fraction > 0 and not r.options.distributed_optimizer:
        return "optimizer CPU offload needs the distributed optimizer"
    return None


def _recompute_graphs(r: RunConfig) -> str | None:
    scopes = r.options.cuda_graph_scope
    if r.options.recompute_granularity == "full" and scopes and "full_iteration" not in scopes:
        return "full recompute works only with full-iteration CUDA graphs, not TE-scoped ones"
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        return "CUDA-graph scope moe_preprocess needs moe_router"
    if "moe" in scopes and "moe_router" in scopes:
        return "CUDA-graph scopes moe and moe_router cannot be combined"
    if r.options.recomputes("moe") and "moe_router" in scopes:
        return "recomputing moe forbids the moe_router CUDA-graph scope (TE impl)"
    return None


def _recompute_modules(r: RunConfig) -> str | None:
    if r.options.recomputes("mla_up_proj") and not r.model.multi_latent_attention:
        return "mla_up_proj recompute needs multi-latent attention"
    if r.options.recomputes("moe_act") and not r.model.is_moe:
        return "moe_act recompute on a dense model"
    if (r.options.recomputes("moe_act") or r.options.recomputes("layernorm")) and r.options.precision == "fp8-delayed":
        return "moe_act/layernorm recompute cannot be used with delayed-scaling FP8"
    return None


def _ep_overlap(r: RunConfig) -> str | None:
    o, lay = r.options, r.layout
    if not o.overlap_moe_expert_parallel_comm:
        return None
    if lay.ep <= 1:
        return "EP overlap needs EP > 1"
    if lay.pp > 1 and lay.vpp == 1:
        return "EP overlap with PP > 1 needs VPP"
    if o.recompute_granularity == "full" or o.recomputes("moe"):
        return "EP overlap forbids full recompute and moe recompute"
    if r.model.mtp_num_layers > 1:
        return "EP overlap needs MTP depth ≤ 1"
    if r.model.mtp_num_layers and lay.pp == 1:
        return "EP overlap with MTP layers needs PP > 1"
    if o.cuda_graph_scope & {"moe", "mlp"}:
        return "EP overlap forbids the moe and mlp CUDA-graph scopes"
    return None


def _precision(r: RunConfig) -> str | None:
    if not r.hardware.supports(r.options.tensor_core_precision):
        return f"{r.hardware.name} has no {r.options.tensor_core_precision} tensor cores"
    return None


def _dp_instances(r: RunConfig) -> str | None:
    k = r.options.num_distributed_optimizer_instances
    if (r.layout.dp * r.layout.cp) % k:
        return f"DP·CP = {r.layout.dp * r.layout.cp} is not a multiple of {k} optimizer instances"
    return None


def _lora(r: RunConfig) -> str | None:
    opt = r.options
    if not opt.is_lora:
        return None
    from lcmoe.estimate.params import layer_signature, lora_adapters

    # Adapters depend on a layer's signature only: one decoder layer per signature is enough.
    firsts = {layer_signature(r.model, layer): layer for layer in reversed(range(r.model.num_layers))}
    adapters = [a for layer in firsts.values() for a in lora_adapters(r.model, layer, opt.lora_targets)]
    if not adapters:
        return f"LoRA targets {','.join(sorted(opt.lora_targets))} match no module of {r.model.name}"
    if any(a.column and not a.expert for a in adapters) and opt.lora_rank % r.layout.tp:
        return f"LoRA rank {opt.lora_rank} does not split over TP = {r.layout.tp} (a column-parallel LoRA-A)"
    return None


def _pack_mbs(r: RunConfig) -> str | None:
    if r.options.is_packed and r.layout.mbs != 1:
        return f"packed documents (THD) need MBS = 1, got {r.layout.mbs}"
    return None


def _pack_graphs(r: RunConfig) -> str | None:
    if r.options.is_packed and r.options.cuda_graph_scope:
        scopes = ",".join(sorted(r.options.cuda_graph_scope))
        return f"packed documents change cu_seqlens every step; CUDA graphs ({scopes}) replay fixed shapes"
    return None


def _pack_backend(r: RunConfig) -> str | None:
    if r.options.is_packed and r.options.attention_backend == "unfused":
        return "packed documents (THD) need a TE fused or flash attention kernel, not the unfused backend"
    return None


RULES: tuple[LegalityRule, ...] = (
    LegalityRule(
        "L-WORLD-EP-FOLD", "mcore parallel_state.py:868-884", "choose EP·ETP·PP that divides the GPU count", _world
    ),
    LegalityRule("L-EXPERTS-EP", "mcore moe/moe_layer.py:185", "use an EP that divides the expert count", _experts),
    LegalityRule(
        "L-HEADS-TP", "mcore transformer_config.py:1350-1373", "use a TP that divides the heads and groups", _heads
    ),
    LegalityRule("L-MOE-BIAS-ETP", "mcore transformer_config.py:2371-2374", "set ETP = 1", _bias_etp),
    LegalityRule("L-GBS", "mcore num_microbatches_calculator.py:381-391", "round GBS to a multiple of MBS·DP", _gbs),
    LegalityRule(
        "L-VPP-MICROBATCHES",
        "mcore pipeline_parallel/schedules.py:1142-1162",
        "make GBS/(MBS·DP) a multiple of PP, or drop VPP",
        _vpp,
    ),
    LegalityRule(
        "L-PP-LAYERS",
        "mcore transformer_block.py:141-172; pipeline_parallel_layer_layout.py:86-150",
        "pass an explicit pipeline_model_parallel_layout (lcmoe writes one)",
        _layers,
    ),
    SEQ_CP,
    SEQ_SP,
    CP_A2A_HEADS,
    CP_HIER_SIZES,
    LegalityRule("L-GDN-TPCP", "mcore transformer_config.py:1400-1414", "use TP·CP dividing the linear heads", _gdn_cp),
    LegalityRule(
        "L-MAMBA-TPCP",
        "mcore ssm/mamba_mixer.py:262-274; ssm/mamba_context_parallel.py:106-130",
        "use TP·CP dividing the Mamba heads, and TP the groups",
        _mamba_tp_cp,
    ),
    LegalityRule(
        "L-DSA-CP",
        "mcore 0.19.2 transformer_config.py:2837-2852; experimental_attention_variant/dsa.py:1808",
        "set cp_comm_type all_gather",
        _dsa_cp,
    ),
    LegalityRule(
        "L-DSA-INDEX-SHARING",
        "mcore experimental_attention_variant/dsa.py DSAttention.forward ('Cross-PP top-k sharing is not supported')",
        "pass a pipeline_model_parallel_layout whose every chunk starts on a layer that computes top-k",
        _dsa_index_sharing,
    ),
    LegalityRule(
        "L-DSA-VERSION",
        "megatron-core 0.16 refuses DSA with CP (transformer_config.py:1987-1990) and has no top-k sharing "
        "fields; 0.19 has both",
        "set CP = 1 and a model without top-k sharing, or target megatron-core ≥ 0.19",
        _dsa_version,
        min_megatron_core="0.19",
    ),
    LegalityRule(
        "L-HYBRID-PIPELINE",
        "mcore models/hybrid/hybrid_layer_allocation.py:372-393 (select_pipeline_segment)",
        "use an even PP split without VPP, or mark the stages with '|' in hybrid_layer_pattern",
        _hybrid_pipeline,
    ),
    LegalityRule(
        "L-GDN-CP-VERSION",
        "megatron-core 0.16 refuses GDN with CP; 0.19 accepts it",
        "set CP = 1 or target megatron-core ≥ 0.19",
        _gdn_cp_version,
        min_megatron_core="0.19",
    ),
    LegalityRule(
        "L-DISPATCHER-GPU",
        "bridge flex_dispatcher_backend.py:88-109",
        "use hybridep on GB200/GB300, alltoall on dense models",
        _dispatcher_gpu,
    ),
    LegalityRule(
        "L-OFFLOAD-DISTOPT",
        "mcore optimizer/__init__.py:509-512; arguments.py:1799-1807",
        "enable the distributed optimizer",
        _offload,
    ),
    LegalityRule(
        "L-RECOMPUTE-GRAPHS",
        "mcore transformer_config.py:2576-2628",
        "drop the conflicting CUDA-graph scope or recompute module",
        _recompute_graphs,
    ),
    LegalityRule(
        "L-RECOMPUTE-MODULES", "mcore transformer_config.py:1824-1888", "use modules the model has", _recompute_modules
    ),
    LegalityRule(
        "L-EP-OVERLAP",
        "bridge comm_overlap.py:478-517; mcore transformer_config.py:2761-2857",
        "disable EP overlap or meet its prerequisites",
        _ep_overlap,
    ),
    LegalityRule(
        "L-PRECISION-GPU",
        "kernels-and-links.md §7 (tensor-core formats per GPU)",
        "use bf16/fp8 on Hopper, mxfp8/nvfp4 only on Blackwell",
        _precision,
    ),
    LegalityRule(
        "L-OPTIMIZER-INSTANCES", "mcore parallel_state.py:922-927", "use instances dividing DP·CP", _dp_instances
    ),
    LegalityRule(
        "L-LORA",
        "bridge peft/lora.py LoRA.transform, peft/utils.py ParallelLinearAdapter; mcore tensor_parallel/layers.py "
        "ColumnParallelLinear (divide(output_size, tp))",
        "target modules the model has (an MLA layer has no linear_qkv) and a rank divisible by TP",
        _lora,
    ),
    LegalityRule(
        "L-PACK-MBS",
        "bridge config.py:1461-1478 (offline packing: 'Micro batch size should be 1'); gpt_step.py:94-108 "
        "(packed THD with CP expects MBS 1)",
        "set MBS = 1 and pack more tokens per sample (a longer --seq-len) instead",
        _pack_mbs,
    ),
    LegalityRule(
        "L-PACK-GRAPHS",
        "bridge config.py:1162-1190 (packed attention graphs need pad_to_max_length and pad_cu_seqlens, "
        "offline packing only); megatron-bridge-facts.md §6.5 (variable lengths break replay)",
        "drop the CUDA-graph scopes for packed data",
        _pack_graphs,
    ),
    LegalityRule(
        "L-PACK-BACKEND",
        "mcore PackedSeqParams / TE DotProductAttention qkv_format='thd' (no unfused THD path)",
        "use the auto, flash or fused attention backend",
        _pack_backend,
    ),
    CP_HIER_THD,
    *ACTIVATION_OFFLOAD_RULES,
    *PAGED_STASH_RULES,
    *DELAY_WGRAD_RULES,
    *DYNAMIC_CP_RULES,
    *MUON_RULES,
    *FSDP_RULES,
)

RULE_IDS = frozenset(rule.id for rule in RULES)
# Rules whose check reads only the model, the hardware and the layout, never the training
# options: the planner judges them once per layout instead of once per option set it tries
# (tests/test_rules.py checks that none of them touches ``run.options``).
LAYOUT_RULE_IDS = frozenset(
    {
        "L-WORLD-EP-FOLD", "L-EXPERTS-EP", "L-HEADS-TP", "L-MOE-BIAS-ETP", "L-GBS", "L-VPP-MICROBATCHES",
        "L-PP-LAYERS", "L-CP-A2A-HEADS", "L-CP-HIER-SIZES", "L-GDN-TPCP", "L-MAMBA-TPCP", "L-DSA-CP",
        "L-DSA-INDEX-SHARING", "L-DSA-VERSION", "L-HYBRID-PIPELINE", "L-GDN-CP-VERSION",
    }
)  # fmt: skip


def version_tuple(text: str) -> tuple[int, ...]:
    """``0.19.2`` → (0, 19, 2); ``2.9.0+cu128`` and ``0.19.0rc1`` keep their first three numbers."""
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def active_rules(megatron_core_version: str = "0.19.2") -> tuple[LegalityRule, ...]:
    """The rules that apply to the targeted Megatron-Core release (a search filters them once)."""
    target = version_tuple(megatron_core_version)
    return tuple(r for r in RULES if not (r.min_megatron_core and target >= version_tuple(r.min_megatron_core)))


def violations(
    run: RunConfig, *, megatron_core_version: str = "0.19.2", rules: tuple[LegalityRule, ...] | None = None
) -> list[Violation]:
    """Every hard rule the run breaks (empty list = legal) for the targeted Megatron-Core release;
    ``rules``: a subset of ``active_rules(megatron_core_version)`` to judge instead of all of them."""
    found = []
    for rule in active_rules(megatron_core_version) if rules is None else rules:
        message = rule.check(run)
        if message:
            found.append(Violation(rule.id, message, rule.fix, rule.source))
    return found
