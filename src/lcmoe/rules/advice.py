"""The long-context guidance (shared/reference/long-context-guidance.md) as data: LC-* rules
with a condition on a run and a message with the numbers filled in. ``advise(run)`` returns the
rules that apply; the planner cites the same ids in its explanations."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from lcmoe.run import RunConfig


@dataclass(frozen=True, slots=True)
class Advice:
    rule: str
    severity: str  # info | warn | error
    text: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "text": self.text}


@dataclass(frozen=True, slots=True)
class AdviceRule:
    id: str
    severity: str
    summary: str
    when: Callable[[RunConfig], str | None]


def suggested_cp(seq_len: int) -> int:
    """LC-CP-START: seq_len / 4096 rounded to a power of two (≥ 1)."""
    return max(1, int(2 ** round(math.log2(max(seq_len / 4096, 1)))))


def _cp_start(r: RunConfig) -> str | None:
    guess = suggested_cp(r.options.seq_len)
    shard = r.options.seq_len // (r.layout.cp * r.layout.tp)
    if r.options.seq_len > 8192:
        choice = "the guess" if r.layout.cp == guess else "ranked faster at this memory than the guess"
        return (
            f"CP starting guess for {r.options.seq_len} tokens is {guess}; CP {r.layout.cp} with TP "
            f"{r.layout.tp} ({shard} tokens per CP×TP shard, guidance ~4K–8K) is {choice}"
        )
    return None


def _dp_budget(r: RunConfig) -> str | None:
    if r.layout.dp == 1 and r.layout.world_size > 1:
        return "DP = 1: no data-parallel slack and GBS is pinned to MBS·GA; a smaller PP or CP would free DP"
    return None


def _gpu_feasible(r: RunConfig) -> str | None:
    lay = r.layout
    minimum = lay.pp * math.lcm(lay.tp * lay.cp, lay.ep * lay.etp)
    if lay.world_size % minimum:
        return f"this layout needs a multiple of PP·lcm(TP·CP, EP·ETP) = {minimum} GPUs"
    return None


def _gbs_shrink(r: RunConfig) -> str | None:
    if r.layout.cp > 1:
        return (
            f"with CP {r.layout.cp} and DP {r.layout.dp}, GBS {r.layout.gbs} gives GA {r.layout.num_microbatches}"
            f" (GBS must stay a multiple of MBS·DP{'·PP' if r.layout.vpp > 1 else ''})"
        )
    return None


def _recompute_selective(r: RunConfig) -> str | None:
    if r.options.recompute_granularity == "full":
        return (
            "full recompute is the last resort; a selective set (mla_up_proj, layernorm, moe_act, mlp, moe) is cheaper"
        )
    if r.options.recompute_granularity == "selective":
        return f"selective recompute of {', '.join(sorted(r.options.recompute_modules))} instead of full"
    return None


def _no_attn_recompute(r: RunConfig) -> str | None:
    if r.options.recomputes("core_attn") and r.options.seq_len >= 32768:
        return "core_attn recompute at long context replays the s² attention while flash attention stores little"
    return None


def _offload(r: RunConfig) -> str | None:
    """What the run moves over the host link at 128K+: the optimizer's share, fine-grained
    activation offloading's modules, the paged stash's host pages; or that it needs none."""
    o = r.options
    if o.seq_len < 131072 or not r.model.is_moe:
        return None
    moved = []
    if o.optimizer_offload_fraction > 0:
        moved.append(f"optimizer CPU offload {o.optimizer_offload_fraction:.0%}")
    if o.activation_offload_modules:
        share = f" ({o.activation_offload_fraction:.0%} of the groups)" if o.activation_offload_fraction != 1.0 else ""
        moved.append(f"activation offloading of {', '.join(sorted(o.activation_offload_modules))}{share}")
    if o.moe_paged_stash and o.moe_paged_stash_buffer_size_factor_cpu:
        moved.append("paged-stash host pages")
    if moved:
        return (
            f"{' and '.join(moved)} over {r.hardware.host_link_kind} "
            f"({r.hardware.host_link_bandwidth / 1e9:.0f} GB/s per direction)"
        )
    return "at 128K+ large MoE usually needs optimizer CPU offload or activation offloading; this plan fits without"


def _precision(r: RunConfig) -> str | None:
    if r.options.is_fp8:
        return f"{r.options.precision} lowers activation and GEMM cost; BF16 remains the safe baseline"
    return None


def _tp_for_cp(r: RunConfig) -> str | None:
    if r.hardware.nvlink_domain_size > 8 and r.layout.tp > 1 and r.layout.cp > 1:
        return f"on {r.hardware.name} TP {r.layout.tp} replaces part of CP inside the NVLink domain"
    return None


def _cp_comm(r: RunConfig) -> str | None:
    if r.layout.cp > 1:
        span = r.layout.tp * r.layout.cp
        where = "inside one NVLink domain" if span <= r.hardware.nvlink_domain_size else "across nodes"
        sizes = r.layout.hierarchical_context_parallel_sizes
        if r.layout.cp_comm_type == "a2a+p2p" and sizes:
            inner = r.layout.tp * sizes[0]
            a2a_where = "inside one NVLink domain" if inner <= r.hardware.nvlink_domain_size else "across nodes"
            return (
                f"CP {r.layout.cp} uses a2a+p2p with a2a over {sizes[0]} CP ranks ({inner} GPUs {a2a_where}) "
                f"and a p2p ring over {sizes[1]}, spanning {span} GPUs {where}"
            )
        return f"CP {r.layout.cp} uses {r.layout.cp_comm_type} and spans {span} GPUs {where}"
    return None


def _dispatcher(r: RunConfig) -> str | None:
    if not r.model.is_moe:
        return None
    if r.hardware.nvlink_domain_size > 8 and r.options.dispatcher != "hybridep":
        return f"on NVL72 prefer HybridEP (DeepEP is refused there); this plan uses {r.options.dispatcher}"
    if r.options.dispatcher in ("deepep", "hybridep"):
        return (
            f"{r.options.dispatcher} needs its package at model construction: check the container has it "
            "before launching (bring-up with alltoall first)"
        )
    return None


def _cuda_graphs(r: RunConfig) -> str | None:
    if r.options.cuda_graph_scope:
        return (
            "CUDA graphs need static seq_len, MBS and routing path: variable-length batches break replay; "
            "TE scopes preferred to full-iteration"
        )
    return None


def _cp_not_ep(r: RunConfig) -> str | None:
    if r.layout.cp > 1 and r.model.is_moe:
        return f"CP {r.layout.cp} folds with EP {r.layout.ep}; it does not replace it"
    return None


RULES: tuple[AdviceRule, ...] = (
    AdviceRule("LC-CP-START", "info", "first CP guess seq/4096 (power of two)", _cp_start),
    AdviceRule("LC-DP-BUDGET", "warn", "keep DP alive", _dp_budget),
    AdviceRule("LC-GPU-FEASIBLE", "error", "minimum GPUs PP·lcm(TP·CP, EP·ETP)", _gpu_feasible),
    AdviceRule("LC-GBS-SHRINK", "info", "GBS follows DP", _gbs_shrink),
    AdviceRule("LC-RECOMPUTE-SELECTIVE", "info", "selective before full recompute", _recompute_selective),
    AdviceRule("LC-NO-ATTN-RECOMPUTE", "warn", "no core_attn recompute at long context", _no_attn_recompute),
    AdviceRule("LC-OFFLOAD-128K", "info", "CPU offload (optimizer, activations) at 128K+", _offload),
    AdviceRule("LC-PRECISION", "info", "FP8 lowers memory", _precision),
    AdviceRule("LC-TP-FOR-CP", "info", "TP for CP on NVL72", _tp_for_cp),
    AdviceRule("LC-CP-COMM", "info", "CP communication type", _cp_comm),
    AdviceRule("LC-DISPATCHER", "info", "dispatcher per system", _dispatcher),
    AdviceRule("LC-CUDA-GRAPH-STATIC", "warn", "graphs only with static shapes", _cuda_graphs),
    AdviceRule("LC-CP-NOT-EP", "info", "CP does not replace EP", _cp_not_ep),
)

# Rules that only the planner or check emit (they compare runs or configs).
PLANNER_ONLY = {
    "LC-FIT-ONLY": "warn",
    "LC-BASELINE-DRIFT": "warn",
    "LC-CONTAINER": "warn",
}
RULE_IDS = frozenset({rule.id for rule in RULES} | set(PLANNER_ONLY))

# Rules that `diagnose` and `check --intended` cite for failures users report on Megatron-LM,
# Megatron Bridge and DeepEP (the table with each one's sources: diagnose/failure_patterns.py). They do not
# come from the long-context guide, so they stay out of RULE_IDS.
FAILURE_RULES: dict[str, str] = {
    "DG-DEEPEP-TIMEOUT": "DeepEP dispatch or combine timed out (CPU side, intranode or internode kernels)",
    "DG-DISPATCHER-FALLBACK": "the requested flex dispatcher (deepep, hybridep) was replaced or is unavailable",
    "DG-CUDA-GRAPH-SCOPE": "CUDA-graph hangs and NaNs in the MoE path, by graph scope",
    "DG-A2A-OVERLAP": "A2A-overlap (overlap_moe_expert_parallel_comm) deadlock",
    "DG-CP-DIVISIBLE": "sequence length not divisible for CP, THD packing or sequence parallelism at run time",
    "DG-OVERRIDE-RESET": "an intended override that the resolved config Bridge saved does not hold",
}


def advise(run: RunConfig) -> list[Advice]:
    """Every LC-* rule whose condition holds for ``run``, with its numbers filled in."""
    out = []
    for rule in RULES:
        text = rule.when(run)
        if text:
            out.append(Advice(rule.id, rule.severity, text))
    if run.options.seq_len >= 131072:
        out.append(
            Advice(
                "LC-CONTAINER",
                "warn",
                "128K+ needs recent Transformer Engine CP fixes: check container, TE and megatron-core",
            )
        )
    return out
