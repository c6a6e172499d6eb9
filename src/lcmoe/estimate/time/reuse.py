"""The amounts of a run's variants from the amounts of the run itself, for the planner: the
variants of one fitted option set (dispatcher × CUDA-graph scope × EP overlap × CP exchange)
share most of what ``time_amounts`` counts, so they take it over instead of counting it again.
Each function returns what ``time_amounts`` returns for the variant (tests/test_time_reuse.py
checks them against it)."""

from __future__ import annotations

from dataclasses import fields

from lcmoe.estimate.memory import StagedLayout
from lcmoe.estimate.params import LayerSignature
from lcmoe.estimate.time.amounts import (
    LayerAmounts,
    RunAmounts,
    StageAmounts,
    attention_cp_bytes,
    dispatch_bytes,
    moe_layer_bytes,
    no_recompute_options,
    stage_layer_groups,
    stage_signatures,
)
from lcmoe.estimate.time.communication import ep_link_shares
from lcmoe.run import RunConfig

_RUN_AMOUNTS_FIELDS = tuple(f.name for f in fields(RunAmounts))
_STAGE_AMOUNTS_FIELDS = tuple(f.name for f in fields(StageAmounts))
_LAYER_AMOUNTS_FIELDS = tuple(f.name for f in fields(LayerAmounts))


def with_fields(amounts: RunAmounts, **changes: object) -> RunAmounts:
    """``dataclasses.replace(amounts, **changes)`` at a fifth of its cost: a bare
    ``object.__new__`` with every field set by ``object.__setattr__``. Exact because RunAmounts
    is a frozen slotted dataclass whose ``__init__`` only stores its fields (no
    ``__post_init__``, no defaults computed from other fields); every name must be a field."""
    clone = object.__new__(RunAmounts)
    for name in _RUN_AMOUNTS_FIELDS:
        object.__setattr__(clone, name, changes.pop(name) if name in changes else getattr(amounts, name))
    if changes:
        raise TypeError(f"RunAmounts has no field {sorted(changes)[0]!r}")
    return clone


def relaunched_amounts(amounts: RunAmounts, run: RunConfig) -> RunAmounts:
    """``time_amounts(run)`` from the amounts of a run that differs from ``run`` only in
    dispatcher, CUDA-graph scope and EP overlap, without recounting the layers: the planner prices
    its dispatcher × graph × overlap variants from one set of amounts, since the FLOPs and bytes
    stay the same and only how tokens travel and kernels launch changes. ``time_amounts`` reads
    those options only into the fields set here, save two cases that are refused: a dispatcher
    that sends tokens at another width (``dispatch_bytes``, in every MoE layer's ep_bytes), and a
    full-iteration graph (its static MoE buffers change the stored bytes, ``dispatched_tokens``;
    the stored bytes are otherwise taken without recompute, where the scope does not matter)."""
    model, layout, options = run.model, run.layout, run.options
    if "full_iteration" in amounts.cuda_graph_scope or "full_iteration" in options.cuda_graph_scope:
        raise ValueError("a full-iteration CUDA graph changes the MoE amounts: use time_amounts")
    if dispatch_bytes(options) != amounts.dispatch_bytes:
        raise ValueError(f"{options.dispatcher} dispatches at another width: use time_amounts")
    local, remote = ep_link_shares(model, layout.ep, layout.etp, run.hardware.nvlink_domain_size, options.dispatcher)
    return with_fields(
        amounts,
        ep_local_share=local,
        ep_remote_share=remote,
        dispatcher=options.dispatcher,
        cuda_graph_scope=frozenset(options.cuda_graph_scope),
        ep_overlap=options.overlap_moe_expert_parallel_comm,
    )


def _regrouped(stage: StageAmounts, groups: tuple[LayerAmounts, ...], counts: tuple[int, ...]) -> StageAmounts:
    """``stage`` with other layer groups (a bare copy, as ``with_fields`` makes one)."""
    clone = object.__new__(StageAmounts)
    for name in _STAGE_AMOUNTS_FIELDS:
        object.__setattr__(clone, name, getattr(stage, name))
    object.__setattr__(clone, "groups", groups)
    object.__setattr__(clone, "counts", counts)
    return clone


def _exchanged_layer(known: LayerAmounts, run: RunConfig, layer: int) -> LayerAmounts:
    """``known`` (a layer of the run ``exchanged_amounts`` starts from) with the CP and EP bytes
    of ``layer`` in ``run`` (a bare copy, as ``with_fields`` makes one)."""
    cp_kv, cp_a2a = attention_cp_bytes(run, layer)
    ep_bytes, _ = moe_layer_bytes(run, layer)
    clone = object.__new__(LayerAmounts)
    for name in _LAYER_AMOUNTS_FIELDS:
        object.__setattr__(clone, name, getattr(known, name))
    object.__setattr__(clone, "cp_kv_bytes_per_step", cp_kv)
    object.__setattr__(clone, "cp_a2a_bytes", cp_a2a if run.layout.cp_comm_type in ("a2a", "a2a+p2p") else 0.0)
    object.__setattr__(clone, "ep_bytes", ep_bytes)
    return clone


def _exchanged_stages(amounts: RunAmounts, run: RunConfig, staged: StagedLayout) -> tuple[StageAmounts, ...]:
    """The stages of ``exchanged_amounts``. Each layer keeps its FLOPs and stored bytes and gets
    its CP and EP bytes counted again: ``_layer_amounts`` reads the CP exchange and the
    dispatcher only into those (``attention_cp_bytes``, ``moe_layer_bytes`` at the dispatch
    width), and the stored bytes (taken without recompute) read the CUDA-graph scope only for a
    full-iteration graph, whose layers are counted again in full."""
    per_signature: dict[LayerSignature, LayerAmounts] = {}
    if "full_iteration" in amounts.cuda_graph_scope or "full_iteration" in run.options.cuda_graph_scope:
        no_recompute = no_recompute_options(run.options)
        return tuple(
            _regrouped(known, *stage_layer_groups(run, stage, per_signature, no_recompute))
            for known, stage in zip(amounts.stages, staged.stages, strict=True)
        )
    stages = []
    for known, stage in zip(amounts.stages, staged.stages, strict=True):
        signatures = stage_signatures(run.model, stage)
        for (signature, (first, _)), layer in zip(signatures.items(), known.groups, strict=True):
            if signature not in per_signature:
                per_signature[signature] = _exchanged_layer(layer, run, first)
        stages.append(_regrouped(known, tuple(per_signature[key] for key in signatures), known.counts))
    return tuple(stages)


def exchanged_amounts(amounts: RunAmounts, run: RunConfig, staged: StagedLayout) -> RunAmounts:
    """``time_amounts(run, staged)`` from the amounts of a run that differs from ``run`` only in
    the CP exchange (``cp_comm_type`` and its a2a+p2p split), the dispatcher (at any dispatch
    width), the CUDA-graph scope and EP overlap, on the same ``staged`` layout. The layers' CP
    and EP bytes are counted again (``_exchanged_stages``), and so are the run-wide fields that
    read those options (set here, as ``time_amounts`` sets them). Everything else is taken over,
    exact because ``time_amounts`` reads none of those fields into it: a stage's logits, PP, DP
    and optimizer amounts (the token count, the parameters per GPU and the optimizer shards read
    the CP size, never its exchange, and no dispatcher, graph or overlap option), and the run's
    peaks, links, token and FLOP counts, chunk and pipeline sizes."""
    layout, options = run.layout, run.options
    hierarchical = layout.cp_comm_type == "a2a+p2p"
    local, remote = ep_link_shares(
        run.model, layout.ep, layout.etp, run.hardware.nvlink_domain_size, options.dispatcher
    )
    return with_fields(
        amounts,
        stages=_exchanged_stages(amounts, run, staged),
        cp_a2a=layout.cp_comm_type in ("a2a", "a2a+p2p"),
        ep_local_share=local,
        ep_remote_share=remote,
        dispatcher=options.dispatcher,
        ep_overlap=options.overlap_moe_expert_parallel_comm,
        cuda_graph_scope=frozenset(options.cuda_graph_scope),
        dispatch_bytes=dispatch_bytes(options),
        cp_outer_ring=layout.cp_ring_size if hierarchical else 0,
        cp_a2a_span=layout.tp * layout.cp_a2a_size if hierarchical else 0,
    )
