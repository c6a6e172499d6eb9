"""The candidates of a plan search: parallel layouts (TP, CP, EP, PP, VPP, MBS) and their common
GBS, the recompute ladder, the precisions and dispatchers to try, and the Bridge-default options a
candidate starts from. Pure functions of the request; ``plan.search`` re-exports every name."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from lcmoe.config_io.bridge import keeps_bf16_grad_buffer, recipe_name
from lcmoe.layout import ParallelLayout, auto_pipeline_layout, needs_explicit_layout
from lcmoe.plan.plans import PlanRequest
from lcmoe.rules.advice import suggested_cp
from lcmoe.run import default_global_batch
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import RecomputeGranularity, TrainingOptions

OFFLOAD_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
# The floor on tokens per step of the common GBS (``common_global_batch``): 4 Mi tokens, Llama 3's
# initial pre-training batch ("an initial batch size of 4M tokens", arXiv:2407.21783 §3.4.1);
# DeepSeek-V3's 128K extension stage ran 480 × 128K ≈ 63M (arXiv:2412.19437 §4.3).
MIN_TOKENS_PER_STEP = 4 * 1024 * 1024


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(limit, 1))) + 1)]


def tp_candidates(model: ModelSpec, hardware: HardwareSpec) -> list[int]:
    """TP inside one node (NVLink domain capped at 8 per the guidance) dividing heads and groups."""
    limit = min(8, hardware.nvlink_domain_size)
    out = []
    for tp in _powers_of_two(limit):
        if model.num_attention_heads % tp:
            continue
        g = model.query_groups
        if not model.multi_latent_attention and g % tp and tp % g:
            continue
        out.append(tp)
    return out


def cp_candidates(seq_len: int) -> list[int]:
    """Powers of two with seq % (2·CP) == 0, at least 1K tokens per CP rank, and no more than 8×
    below the guidance's starting guess seq/4096 (LC-CP-START): smaller CP leaves each rank with
    8× the activations of the guess, which the memory prune removes anyway."""
    floor = max(1, suggested_cp(seq_len) // 8)
    return [
        cp for cp in _powers_of_two(max(seq_len // 1024, 1)) if cp >= floor and (cp == 1 or seq_len % (2 * cp) == 0)
    ]


def ep_candidates(model: ModelSpec) -> list[int]:
    experts = model.num_moe_experts or 1
    return [ep for ep in _powers_of_two(experts) if experts % ep == 0] or [1]


def pp_candidates(model: ModelSpec) -> list[int]:
    return [pp for pp in _powers_of_two(min(model.num_layers, 32))]


def vpp_candidates(model: ModelSpec, pp: int) -> list[int]:
    if pp == 1:
        return [1]
    return [v for v in (1, 2, 4, 8) if model.num_layers // (pp * v) >= 2]


@dataclass(frozen=True, slots=True)
class LayoutShape:
    """A candidate layout before its GBS is set."""

    tp: int
    cp: int
    pp: int
    vpp: int
    dp: int
    ep: int
    mbs: int
    pipeline_layout: str | None

    @property
    def gbs_unit(self) -> int:
        """The GBS must be a multiple of this: MBS·DP, times PP with VPP (rules L-GBS, L-VPP)."""
        return self.mbs * self.dp * (self.pp if self.vpp > 1 else 1)


def layout_shapes(request: PlanRequest) -> Iterator[LayoutShape]:
    model, hw, gpus, seq = request.model, request.hardware, request.num_gpus, request.seq_len
    for tp in tp_candidates(model, hw):
        for cp in cp_candidates(seq):
            for pp in pp_candidates(model):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                for vpp in vpp_candidates(model, pp):
                    layout_text = None
                    if pp * vpp > 1 and needs_explicit_layout(model, pp, vpp):
                        layout_text = auto_pipeline_layout(model, pp, vpp)
                        if layout_text is None:
                            continue
                    for ep in ep_candidates(model):
                        if gpus % (ep * pp):
                            continue
                        for mbs in (1, 2) if seq <= 8192 else (1,):
                            yield LayoutShape(tp, cp, pp, vpp, dp, ep, mbs, layout_text)


def common_global_batch(units: list[int], seq_len: int) -> int:
    """One GBS for every candidate of a request, so that their ranks compare equal work: the
    smallest common multiple of the candidates' GBS units (each can run it exactly), doubled until
    a step holds at least MIN_TOKENS_PER_STEP tokens (a realistic batch, and enough microbatches
    that no pipeline is ranked on a bubble a real run would not have)."""
    gbs = 1
    for unit in units:
        gbs = gbs * unit // math.gcd(gbs, unit)
    base = gbs
    while gbs * seq_len < MIN_TOKENS_PER_STEP:
        gbs += base
    return gbs


def gbs_reason(gbs: int, seq_len: int, requested: int | None) -> str:
    """The sentence the plan prints about its GBS."""
    if requested:
        return (
            f"GBS {requested} as requested, rounded per layout to a multiple of MBS·DP (·PP with VPP) where it is "
            "not one (LC-GBS-SHRINK)"
        )
    return (
        f"GBS {gbs} for every plan ({gbs * seq_len / 2**20:.1f}Mi tokens per step), so ranks compare equal work: "
        f"the smallest GBS every candidate layout can run (a multiple of MBS·DP, ·PP with VPP) with at least "
        f"{MIN_TOKENS_PER_STEP // 2**20}Mi tokens per step (Llama 3's pre-training batch); --gbs sets another"
    )


def enumerate_layouts(request: PlanRequest, gbs: int | None = None) -> Iterator[ParallelLayout]:
    """Every candidate layout; at ``gbs`` when given, else at the request's (``--gbs`` rounded per
    layout) or, without one, at the request's common GBS."""
    shapes = list(layout_shapes(request))
    if gbs is None and request.gbs is None:
        gbs = common_global_batch([s.gbs_unit for s in shapes], request.seq_len)
    for s in shapes:
        yield ParallelLayout(
            tp=s.tp,
            cp=s.cp,
            ep=s.ep,
            etp=1,
            pp=s.pp,
            vpp=s.vpp,
            dp=s.dp,
            mbs=s.mbs,
            gbs=gbs or default_global_batch(s.dp, s.mbs, s.pp, s.vpp, request.gbs),
            sequence_parallel=s.tp > 1,
            pipeline_layout=s.pipeline_layout,
            cp_comm_type="all_gather" if request.model.is_dsa and s.cp > 1 else "p2p",
        )


def recompute_ladder(model: ModelSpec) -> list[tuple[RecomputeGranularity, frozenset[str]]]:
    """None, then the guidance's selective sets narrowest first (LC-RECOMPUTE-SELECTIVE), then full."""
    ladder: list[tuple[RecomputeGranularity, frozenset[str]]] = [("none", frozenset())]
    sets: list[set[str]] = []
    if model.is_moe:
        sets.append({"moe_act"})
        sets.append({"moe_act", "layernorm"})
    if model.multi_latent_attention:
        sets.append({"mla_up_proj", "layernorm"} | ({"moe_act"} if model.is_moe else set()))
    # layernorm recompute reaches only standalone norms (MoE pre-MLP, MLA input); a dense GQA
    # model's norms are fused into the next GEMM (estimate.memory.norm_bytes).
    standalone_norms = model.is_moe or model.multi_latent_attention
    widest = {"mlp"} | ({"layernorm"} if standalone_norms else set())
    widest |= {"mla_up_proj"} if model.multi_latent_attention else set()
    if model.is_moe:
        sets.append(widest | {"moe_act"})
        sets.append(widest | {"moe"})
    else:
        sets.append(widest)
    seen: list[frozenset[str]] = []
    for s in sets:
        f = frozenset(s)
        if f not in seen:
            seen.append(f)
            ladder.append(("selective", f))
    ladder.append(("full", frozenset()))
    return ladder


# From this sequence length on the search tries fine-grained activation offloading (the guidance's
# 128K+ regime, long-context-guidance.md LC-OFFLOAD-128K, where recompute alone gets expensive).
ACTIVATION_OFFLOAD_MIN_SEQ = 131072


def activation_offload_rung(
    model: ModelSpec, seq_len: int
) -> tuple[RecomputeGranularity, frozenset[str], frozenset[str]] | None:
    """(granularity, recompute modules, offload modules) of the one offloading rung the search
    tries, or None below ACTIVATION_OFFLOAD_MIN_SEQ: the ladder's widest selective rung that still
    runs the experts' GEMMs once (``moe_act``, not ``moe``: Megatron-Core refuses expert offload
    inside a recomputed MoE, L-AOFF-MOE-RECOMPUTE), offloading the largest inputs it keeps:
    expert FC1's (the dispatched tokens) and core attention's Q, K, V and output, with attn_proj
    (needs core_attn, L-AOFF-ATTN-PROJ)."""
    if seq_len < ACTIVATION_OFFLOAD_MIN_SEQ:
        return None
    selective = [modules for granularity, modules in recompute_ladder(model) if granularity == "selective"]
    base = [m for m in selective if "moe" not in m] if model.is_moe else selective
    if not base:
        return None
    offload = {"core_attn", "attn_proj"} | ({"expert_fc1"} if model.is_moe else set())
    return "selective", base[-1], frozenset(offload)


def precisions_for(request: PlanRequest) -> tuple[str, ...]:
    if request.precisions:
        return request.precisions
    if request.hardware.supports("mxfp8"):
        return ("bf16", "mxfp8")
    if request.hardware.supports("fp8"):
        return ("bf16", "fp8-blockwise")
    return ("bf16",)


def dispatchers_for(request: PlanRequest) -> tuple[str, ...]:
    if request.dispatchers:
        return request.dispatchers
    if not request.model.is_moe:
        return ("alltoall",)
    if request.hardware.nvlink_domain_size > 8:
        return ("alltoall", "hybridep")
    return ("alltoall", "deepep", "hybridep")


def base_options(request: PlanRequest, precision: str) -> TrainingOptions:
    """Bridge perf-recipe defaults: distributed + precision-aware optimizer (BF16 moments),
    expandable segments, alltoall dispatcher, and a BF16 gradient buffer where the model's Bridge
    recipe can keep one under lcmoe's overrides (``keeps_bf16_grad_buffer``: a recipe that names
    its mixed precision reduces gradients in FP32, so the plan counts what will run)."""
    options = TrainingOptions(
        seq_len=request.seq_len,
        precision=precision,
        main_grads_dtype="bf16",
        exp_avg_dtype="bf16",
        dispatcher="alltoall",
        peft=request.peft,
        lora_rank=request.lora_rank,
        lora_targets=request.lora_targets,
        lora_input_regather=request.lora_input_regather,
        doc_lengths=request.doc_lengths,
    )
    if precision != "fp16" and not keeps_bf16_grad_buffer(recipe_name(request.model, options, request.hardware)):
        options = replace(options, main_grads_dtype="fp32")
    chosen: dict[str, Any] = dict(request.optimizer)
    if chosen.get("optimizer") == "muon":
        # Muon keeps FP32 momentum and main grads: no precision-aware optimizer (L-MUON-PRECISION-AWARE),
        # as Bridge's Kimi-K2 recipe runs it (grad_reduce_in_fp32, kimi_k2.py:66-75).
        options = replace(options, main_grads_dtype="fp32", exp_avg_dtype="fp32", **chosen)
    return options
