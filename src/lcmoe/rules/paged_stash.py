"""Sync-free experts and the MoE paged stash (Megatron-Core ``moe_expert_rank_capacity_factor``,
``moe_paged_stash``): what Megatron-Core refuses with them, and where lcmoe's load model says
every step would overflow and re-run.

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2 ``transformer/
transformer_config.py`` (``tc``), ``transformer/moe/experts.py``, ``transformer/moe/
token_dispatcher.py``, ``transformer/moe/paged_stash.py`` and megatron-bridge 0.6.2
``training/train.py``. The rules lcmoe's options cannot break are kept out of the table and
named here: layer-level ``cpu_offloading`` (tc:1905-1906; lcmoe never emits it and ``check``
refuses a config that sets both, ``config_io.paged_stash``), ``use_transformer_engine_op_fuser``
(tc:1699-1705; emitted whenever a rank capacity factor is), the ncclep backend (tc:1692-1698, not
an lcmoe dispatcher) and TE ≥ 2.14 (experts.py:343, Bridge 0.6.2's container).
"""

from __future__ import annotations

from lcmoe.estimate.memory.paged_stash import stash_factor
from lcmoe.rules.activation_offload import EXPERT_OFFLOAD_MODULES
from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig


def _stash_without_capacity(r: RunConfig) -> str | None:
    o = r.options
    if o.moe_paged_stash and o.moe_expert_rank_capacity_factor is None:
        return "moe_paged_stash without moe_expert_rank_capacity_factor"
    return None


def _capacity_dispatcher(r: RunConfig) -> str | None:
    o = r.options
    if o.moe_expert_rank_capacity_factor is None:
        return None
    if not r.model.is_moe:
        return "a rank capacity factor on a model without routed experts"
    if o.dispatcher != "hybridep":
        return f"moe_expert_rank_capacity_factor with the {o.dispatcher} dispatcher"
    return None


def _fused_mlp(r: RunConfig) -> str | None:
    """The TE op-fuser grouped MLP the capacity factor needs with HybridEP (tc:1699-1705, and
    experts.py:286-289 asserts it is supported): no expert TP (:347-348), TE grouped linears
    (:355-358), a SwiGLU expert (lcmoe's GLU experts; :365-392) through the CuTe DSL kernel
    (:394-400), which is sm100+ (tc:955-961)."""
    o = r.options
    if o.moe_expert_rank_capacity_factor is None or not r.model.is_moe:
        return None
    if r.layout.etp > 1:
        return f"the fused grouped MLP with expert TP {r.layout.etp}"
    if not o.moe_grouped_gemm:
        return "the fused grouped MLP without grouped GEMM"
    if not r.model.gated_linear_unit:
        return "the fused grouped MLP on non-GLU experts (lcmoe models only SwiGLU fused experts)"
    if r.hardware.architecture != "blackwell":
        return f"the CuTe DSL fused grouped MLP on {r.hardware.architecture} (sm100+ only)"
    return None


def _stash_expert_offload(r: RunConfig) -> str | None:
    o = r.options
    inside = EXPERT_OFFLOAD_MODULES & o.activation_offload_modules
    if o.moe_paged_stash and inside:
        return f"moe_paged_stash with {', '.join(sorted(inside))} offloaded"
    return None


def _budget_overflow(r: RunConfig) -> str | None:
    o = r.options
    cap = o.moe_expert_rank_capacity_factor
    if cap is not None and cap < o.moe_token_imbalance:
        return (
            f"a rank capacity factor of {cap:g} below the busiest rank's load ({o.moe_token_imbalance:g}× the "
            "balanced tokens): HybridEP drops tokens every step and the step re-runs"
        )
    return None


def _pool_overflow(r: RunConfig) -> str | None:
    """The pages (GPU + host, ``memory.paged_stash.stash_factor`` of each factor) must hold the
    busiest rank's tokens, ``moe_token_imbalance`` × the expected ones, in lcmoe's load model."""
    o = r.options
    if not o.moe_paged_stash:
        return None
    imbalance = o.moe_token_imbalance
    pool = stash_factor(o.moe_paged_stash_buffer_size_factor_cuda, imbalance)
    pool += stash_factor(o.moe_paged_stash_buffer_size_factor_cpu, imbalance)
    if pool < imbalance:
        return (
            f"stash pages for {pool:g}× the expected tokens (GPU + host) below the busiest rank's "
            f"{imbalance:g}×: the stash overflows every step and the step re-runs"
        )
    return None


STASH_CAPACITY = LegalityRule(
    "L-STASH-CAPACITY",
    "mcore transformer_config.py:1907-1911",
    "set moe_expert_rank_capacity_factor (Bridge's recipes use 1.5) or drop moe_paged_stash",
    _stash_without_capacity,
)
STASH_DISPATCHER = LegalityRule(
    "L-STASH-DISPATCHER",
    "mcore transformer_config.py:1692-1698 (rank capacity only with the hybridep or ncclep flex backend)",
    "use the hybridep dispatcher on a MoE model, or unset moe_expert_rank_capacity_factor",
    _capacity_dispatcher,
)
STASH_FUSED_MLP = LegalityRule(
    "L-STASH-FUSED-MLP",
    "mcore transformer_config.py:1699-1705, transformer/moe/experts.py:286-289, 332-400",
    "use ETP 1, grouped GEMM and Blackwell GPUs, or unset moe_expert_rank_capacity_factor",
    _fused_mlp,
)
STASH_OFFLOAD = LegalityRule(
    "L-STASH-OFFLOAD",
    "mcore transformer_config.py:1912-1921",
    "drop expert_fc1 / moe_act from the offload modules (the stash covers them)",
    _stash_expert_offload,
)
STASH_BUDGET = LegalityRule(
    "L-STASH-BUDGET",
    "mcore token_dispatcher.py:1090-1100, 1158-1162; paged_stash.py:1149-1239 (PagedStashRunner re-runs the step)",
    "raise moe_expert_rank_capacity_factor to at least the token imbalance",
    _budget_overflow,
)
STASH_POOL = LegalityRule(
    "L-STASH-POOL",
    "mcore transformer/moe/paged_stash.py:546-627 (pages for |factor| × the tokens), 1149-1239 (re-run on overflow)",
    "give the stash pages for the token imbalance (moe_paged_stash_buffer_size_factor_cuda, or host pages "
    "with moe_paged_stash_buffer_size_factor_cpu)",
    _pool_overflow,
)
PAGED_STASH_RULES = (STASH_CAPACITY, STASH_DISPATCHER, STASH_FUSED_MLP, STASH_OFFLOAD, STASH_BUDGET, STASH_POOL)
