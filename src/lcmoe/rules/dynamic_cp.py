"""Dynamic context-parallel rules (``TrainingOptions.dynamic_context_parallel``): what Megatron-Core
and Megatron-LM refuse, or silently ignore, with it.

Sources are megatron-core 0.19.2 (``mcore``, where the feature is ``hybrid_context_parallel``),
Megatron-LM's ``megatron/training`` shipped beside it (``megatron-lm``), and Megatron-LM's dev
branch at d48bd6b (2026-08-21, ``dev``), where NVIDIA/Megatron-LM#2000 ("Dynamic CP (part 2)")
renamed it ``dynamic_context_parallel``, added ``min_dynamic_context_parallel_size``, packs a
rank's documents into microbatches, allows pipeline parallelism and MLA. Neither core_r0.19.0
nor main (version 0.20.0, 2026-08-22) has those, so the rules that dev lifts apply to every
release below ``DYNAMIC_CP_RELEASE``, the first release after 0.20: ``--megatron-core-version``
at or above it drops them.

Checks lcmoe's configs cannot break are named here and kept out of the table: ``dataloader_type``
'single' (megatron-lm arguments.py:1408; the default, and the emitters set it) and
``calculate_per_token_loss`` (:1409; the emitters set it). CUDA graphs (:1406) are refused for
packed data already (L-PACK-GRAPHS).

Front end: Megatron Bridge 0.6.2 passes the flag to ``initialize_model_parallel``
(bridge training/initialize.py:799-806), but its training loop never wraps the data iterator in
``HybridCPDataLoaderWrapper`` and its GPT step slices batches with ``is_hybrid_cp=False``
(gpt_step.py:336), and Bridge main (067f987, 2026-08-22) still does (gpt_step.py:475): dynamic CP
runs through Megatron-LM's ``pretrain_gpt.py`` (training.py:3478-3479, data_samplers.py:49-56),
which ``estimate.dynamic_cp.dynamic_cp_caveats`` says on every dynamic-CP plan.
"""

from __future__ import annotations

from lcmoe.estimate.dynamic_cp import dcp_pad_multiple, dcp_pool, largest_group
from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig

DYNAMIC_CP_RELEASE = "0.21.0"
# The first release with the feature (as hybrid_context_parallel): NVIDIA/Megatron-LM#2282,
# 2026-01-17; core_r0.15.0 has no such field, core_r0.16.0 does (model_parallel_config.py).
HYBRID_CP_RELEASE = "0.16.0"


def _release(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel:
        return f"dynamic (hybrid) context parallelism needs Megatron-Core ≥ {HYBRID_CP_RELEASE}"
    return None


def _packed(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and not r.options.is_packed:
        return "dynamic CP schedules the documents of packed samples, but the data is fixed-length"
    return None


def _pipeline(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.layout.pp > 1:
        return f"dynamic CP runs only in the no-pipelining schedule, not with PP = {r.layout.pp}"
    return None


def _mla(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.model.multi_latent_attention:
        return "dynamic CP is refused by multi-latent attention (MLA) in this release"
    return None


def _fsdp(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.options.megatron_fsdp:
        return "dynamic CP is not supported with Megatron-FSDP"
    return None


def _ep_overlap(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.options.overlap_moe_expert_parallel_comm:
        return "with EP overlap the combined 1F1B schedule runs first and dynamic CP is silently off"
    return None


def _pool(r: RunConfig) -> str | None:
    if not r.options.dynamic_context_parallel:
        return None
    pool = dcp_pool(r.layout)
    if pool < 2 or pool % 2:
        return f"dynamic CP needs an even number of DP×CP ranks, not DP·CP = {pool}"
    most = largest_group(r.options, r.layout)
    if most > pool:
        return (
            f"a {r.options.seq_len}-token document needs a group of {most} ranks at max_seqlen_per_dp_cp_rank "
            f"{r.options.max_seqlen_per_dp_cp_rank or r.options.seq_len // r.layout.cp}, more than DP·CP = {pool}"
        )
    return None


def _seq(r: RunConfig) -> str | None:
    if not r.options.dynamic_context_parallel:
        return None
    multiple = dcp_pad_multiple(r.layout)
    if r.options.seq_len % multiple:
        return f"sequence {r.options.seq_len} is not divisible by 2·DP·CP (·TP with SP) = {multiple}"
    return None


def _comm(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.layout.cp > 1 and r.layout.cp_comm_type == "a2a+p2p":
        return "dynamic CP groups are flat, so a2a+p2p has no second level to run on"
    return None


def _min_size_version(r: RunConfig) -> str | None:
    if r.options.dynamic_context_parallel and r.options.min_dynamic_context_parallel_size > 1:
        return (
            f"min_dynamic_context_parallel_size {r.options.min_dynamic_context_parallel_size} needs a Megatron-Core "
            f"release ≥ {DYNAMIC_CP_RELEASE} (Megatron-LM dev only today)"
        )
    return None


def _min_size(r: RunConfig) -> str | None:
    o = r.options
    if not o.dynamic_context_parallel:
        return None
    size, pool = o.min_dynamic_context_parallel_size, dcp_pool(r.layout)
    if size > pool:
        return f"min_dynamic_context_parallel_size {size} is more than DP·CP = {pool}"
    return None


DCP_RELEASE = LegalityRule(
    "L-DCP-RELEASE",
    "Megatron-LM core_r0.16.0 model_parallel_config.py (hybrid_context_parallel, NVIDIA/Megatron-LM#2282); "
    "absent from core_r0.15.0",
    f"target Megatron-Core ≥ {HYBRID_CP_RELEASE}, or turn dynamic CP off",
    _release,
    min_megatron_core=HYBRID_CP_RELEASE,
)
DCP_PACKED = LegalityRule(
    "L-DCP-PACKED",
    "mcore model_parallel_config.py:120-125 ('when we use packed samples with variable sequence lengths'); "
    "core/datasets/data_schedule.py:258-275 (the documents come from each sample's cu_seqlens)",
    "pass the data's --doc-lengths, or turn dynamic CP off",
    _packed,
)
DCP_PIPELINE = LegalityRule(
    "L-DCP-PIPELINE",
    "megatron-lm training/arguments.py:1405 ('Hybrid context parallelism not supported with pipeline "
    "parallelism'); mcore pipeline_parallel/schedules.py:768 (only forward_backward_no_pipelining runs it)",
    "use PP = 1, or turn dynamic CP off",
    _pipeline,
    min_megatron_core=DYNAMIC_CP_RELEASE,
)
DCP_MLA = LegalityRule(
    "L-DCP-MLA",
    "mcore transformer/multi_latent_attention.py:684-687 ('hybrid_context_parallel is not supported with MLA "
    "yet'); dev multi_latent_attention.py:345-351 switches the MLA CP group per microbatch",
    "turn dynamic CP off for MLA models, or target a release that has dev's MLA support",
    _mla,
    min_megatron_core=DYNAMIC_CP_RELEASE,
)
DCP_FSDP = LegalityRule(
    "L-DCP-FSDP",
    "megatron-lm training/arguments.py:1407; dev arguments.py:1545-1547",
    "use the distributed optimizer, or turn dynamic CP off",
    _fsdp,
)
DCP_EP_OVERLAP = LegalityRule(
    "L-DCP-EP-OVERLAP",
    "mcore pipeline_parallel/schedules.py:751-768 (overlap_moe_expert_parallel_comm is tested before "
    "hybrid_context_parallel)",
    "turn EP overlap off with dynamic CP",
    _ep_overlap,
)
DCP_POOL = LegalityRule(
    "L-DCP-POOL",
    "mcore parallel_state.py:1040-1049 (an even number of DP×CP ranks); pipeline_parallel/"
    "hybrid_cp_schedule.py:43-52, 167-180 (a document needs 2^⌈log₂(ℓ/max_seqlen_per_dp_cp_rank)⌉ free ranks)",
    "raise max_seqlen_per_dp_cp_rank to at least seq_len / (DP·CP), or use more DP·CP ranks",
    _pool,
)
DCP_SEQ = LegalityRule(
    "L-DCP-SEQ",
    "mcore datasets/gpt_dataset.py:62-67 (each sample divisible by DP·CP·2, ·SP size with sequence "
    "parallelism); dev training/datasets/sft_dataset.py _calculate_padding_divisor",
    "use a sequence length divisible by 2·DP·CP (·TP with sequence parallelism)",
    _seq,
)
DCP_COMM = LegalityRule(
    "L-DCP-COMM",
    "mcore parallel_state.py:440-462 (one flat group per size); extensions/transformer_engine.py:1984-2002 "
    "(the document's group replaces TE's CP group, with the layer's cp_comm_type)",
    "use p2p CP with dynamic CP",
    _comm,
)
DCP_MIN_SIZE_VERSION = LegalityRule(
    "L-DCP-MIN-SIZE-VERSION",
    "mcore 0.19.2 model_parallel_config.py:111-125 (no min_dynamic_context_parallel_size); dev "
    "model_parallel_config.py:83-92 and parallel_state.py:553-554, 921-945 (NVIDIA/Megatron-LM#2000)",
    f"keep min_dynamic_context_parallel_size 1, or target Megatron-Core ≥ {DYNAMIC_CP_RELEASE}",
    _min_size_version,
    min_megatron_core=DYNAMIC_CP_RELEASE,
)
DCP_MIN_SIZE = LegalityRule(
    "L-DCP-MIN-SIZE",
    "dev training/arguments.py:1562-1566 (min_dynamic_context_parallel_size <= dp_size * cp_size)",
    "use a min_dynamic_context_parallel_size at most DP·CP",
    _min_size,
)
DYNAMIC_CP_RULES = (
    DCP_RELEASE,
    DCP_PACKED,
    DCP_PIPELINE,
    DCP_MLA,
    DCP_FSDP,
    DCP_EP_OVERLAP,
    DCP_POOL,
    DCP_SEQ,
    DCP_COMM,
    DCP_MIN_SIZE_VERSION,
    DCP_MIN_SIZE,
)
