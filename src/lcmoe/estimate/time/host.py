"""Host (launch) time per layer and what CUDA graphs and dispatcher syncs do to it."""

from __future__ import annotations

from lcmoe.estimate.time.coefficients import TimeCoefficients
from lcmoe.specs.model import AttentionKind

# Dispatchers whose device-to-host copy of the per-expert token counts in every MoE layer is
# charged as exposed host time (the all-to-all split sizes; Megatron token_dispatcher.py
# ``cuda_sync_point`` / ``_maybe_dtoh_and_synchronize``; DeepEP normal mode returns
# ``num_recv_tokens_per_expert_list`` to Python). Dropless HybridEP reads its count back as well
# (DeepEP hybrid_ep_buffer.py ``num_dispatched_tokens_tensor.item()``; token_dispatcher.py
# _HybridEPManager: "CPU sync in dispatch" unless moe_expert_rank_capacity_factor gives a static
# budget), but charging it the same contradicts the published HybridEP runs (refit MAPE 5.3% →
# 6.3%, and the DeepEP / alltoall Qwen3-30B H100 rows then +32…+40%): the model keeps HybridEP
# unblocked, an approximation the data supports rather than the code.
HOST_SYNCING_DISPATCHERS = frozenset({"alltoall", "allgather", "deepep"})


# Share of a MoE layer's host launch work (forward + backward) in the router and in the
# dispatcher's preprocess, the two MoE pieces TE-scoped CUDA graphs can capture without static
# expert shapes. Counted from Megatron's MoE forward (moe_layer.py, router.py,
# token_dispatcher.py): of ~37 forward launches, the router (gate GEMM, score function, top-k,
# aux-loss / bias terms) issues ~8 and the preprocess (tokens per expert, splits, row-id map)
# ~6; the rest is permute, dispatch, grouped GEMMs, activation, combine and shared experts.
MOE_ROUTER_HOST_SHARE = 8 / 37
MOE_PREPROCESS_HOST_SHARE = 6 / 37


def graphed_host_shares(scope: frozenset[str], is_moe: bool) -> tuple[float, float]:
    """(share of the non-MoE host work, share of the MoE host work) that ``scope`` captures in
    CUDA graphs (transformer_config.py ``cuda_graph_scope``): ``full_iteration`` all of it;
    ``attn`` the attention block (all non-MoE work of a MoE layer, half of a dense layer's, the
    other half being its MLP, which ``mlp`` captures); ``moe`` the whole MoE block;
    ``moe_router`` / ``moe_preprocess`` their launch shares (MOE_*_HOST_SHARE)."""
    if "full_iteration" in scope:
        return 1.0, 1.0
    dense = 0.0
    if "attn" in scope:
        dense += 1.0 if is_moe else 0.5
    if "mlp" in scope and not is_moe:
        dense += 0.5
    if "moe" in scope:
        moe = 1.0
    else:
        moe = MOE_ROUTER_HOST_SHARE * ("moe_router" in scope) + MOE_PREPROCESS_HOST_SHARE * ("moe_preprocess" in scope)
    return dense, moe if is_moe else 0.0


def hybrid_host_units(scope: frozenset[str], kind: AttentionKind, is_moe: bool) -> tuple[float, float]:
    """(units of t_layer, captured share of them) for a hybrid model's one-block layer: a mixer
    (Mamba, captured by ``mamba``; attention, by ``attn``) or a dense MLP (``mlp``) is half a
    transformer layer's non-MoE host work; a MoE-only layer has none beyond its MoE block."""
    if is_moe:
        return 0.0, 0.0
    graph = "mamba" if kind is AttentionKind.MAMBA else "attn" if kind is not AttentionKind.NONE else "mlp"
    captured = "full_iteration" in scope or graph in scope
    return 0.5, 1.0 if captured else 0.0


def layer_host_seconds(
    scope: frozenset[str],
    is_moe: bool,
    c: TimeCoefficients,
    local_experts: float = 0.0,
    *,
    kind: AttentionKind = AttentionKind.GQA,
    has_mlp: bool = True,
) -> float:
    """Host launch time of one layer, forward + backward: the fitted per-layer (and per-MoE-layer)
    launch time, less what CUDA graphs save on the captured share, plus the per-expert launches
    that only a graph of the experts (``moe``, ``full_iteration``) captures:
    t_layer·u·(1 − s·g_dense) + t_moe·(1 − s·g_moe) + t_expert·E_local·(1 − s·g_experts),
    s = cuda_graph_overhead_saving for per-layer graphs, 1 for a full-iteration graph (the step is
    one graph replay: no Python runs between the captured kernels); u = 1 for a transformer layer,
    hybrid_host_units for a hybrid model's one-block layer."""
    dense_share, moe_share = graphed_host_shares(scope, is_moe)
    units = 1.0
    if kind is AttentionKind.NONE or not has_mlp:
        units, dense_share = hybrid_host_units(scope, kind, is_moe)
    saving = 1.0 if "full_iteration" in scope else c.cuda_graph_overhead_saving
    host = c.layer_overhead_seconds * units * (1 - saving * dense_share)
    if is_moe:
        host += c.moe_layer_overhead_seconds * (1 - saving * moe_share)
        experts_graphed = bool(scope & {"moe", "full_iteration"})
        host += c.expert_host_seconds * local_experts * (1 - saving * experts_graphed)
    return host


def exposed_host_seconds(host: float, gpu: float, *, host_sync: bool) -> float:
    """Host launch time a layer adds to the step. Without a sync the host runs ahead and only its
    excess over the layer's GPU time is exposed: max(0, host − gpu); after a device-to-host sync
    the GPU waits for every launch that follows, so the whole host time is exposed."""
    return host if host_sync else max(0.0, host - gpu)
