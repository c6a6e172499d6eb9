"""Recompute: the forward cost of the recomputed modules, replayed in the backward pass."""

from __future__ import annotations

from lcmoe.estimate.time.amounts import LayerAmounts, RunAmounts

# Share of a layer's elementwise (HBM) time in one recomputable elementwise module (``moe_act``:
# the expert activation; ``layernorm``: a standalone norm): one of the ~10 activation-sized
# elementwise passes a layer stores and re-reads (memory.layer_activation_bytes counts them).
REPLAYED_ELEMENTWISE_SHARE = 0.1


def recompute_seconds(
    a: RunAmounts,
    g: LayerAmounts,
    gemm: float,
    dense: float,
    experts: float,
    attention: float,
    elementwise: float,
    ep: float,
    *,
    scan: float = 0.0,
) -> float:
    """The forward cost of recomputed modules, replayed in backward: full recompute replays the
    whole layer (forward compute, elementwise, and the layer's forward EP comm); selective
    replays only the named modules (core_attn: attention forward; mla_up_proj: the up
    projections; mlp: the dense MLP; moe: expert + shared GEMMs and dispatch; moe_act,
    layernorm: their elementwise share, where the module exists). The forward is 1/3 of a
    3-pass cost (attention, scan: Bridge's forward + 2× backward count; elementwise), 1/gemm_passes of
    a GEMM cost, and 1/2 of the EP comm (dispatch + combine run forward and backward)."""
    forward = (dense + experts) / a.gemm_passes + (attention + scan) / 3
    if a.recompute_granularity == "full":
        return forward + elementwise / 3 + ep / 2
    if a.recompute_granularity != "selective":
        return 0.0
    mods = a.recompute_modules
    extra = 0.0
    if "core_attn" in mods:
        extra += attention / 3
    if "mla_up_proj" in mods:
        extra += g.up_projection_flops / gemm / 3
    if "mlp" in mods and not g.is_moe:
        extra += g.dense_mlp_flops / gemm / 3
    if "moe" in mods and g.is_moe:
        extra += experts / a.gemm_passes + g.dense_mlp_flops / gemm / 3 + ep / 2
    if "shared_experts" in mods and g.is_moe:
        extra += g.dense_mlp_flops / gemm / 3
    if "moe_act" in mods and g.is_moe:
        extra += REPLAYED_ELEMENTWISE_SHARE * elementwise / 3
    # Only a standalone norm is replayed: MLA's input norm and the MoE pre-MLP norm (the others
    # are fused into the next GEMM and never checkpointed; memory.norm_bytes).
    if "layernorm" in mods and (g.is_moe or g.up_projection_flops > 0):
        extra += REPLAYED_ELEMENTWISE_SHARE * elementwise / 3
    return extra
