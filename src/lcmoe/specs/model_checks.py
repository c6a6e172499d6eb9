"""ModelSpec's checks across fields (each field's own range is checked by its ``Field``): what
Megatron-Core would refuse when it builds the model, as one ValueError sentence naming the
fields, their values and what they must satisfy. ``ModelSpec``'s model validator runs
``check_model``; the first failing check is reported, in the order below."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from lcmoe.specs.layer_patterns import (
    HYBRID_ATTENTION,
    HYBRID_MAMBA,
    HYBRID_MLP,
    HYBRID_MOE,
    split_hybrid_pattern,
)

if TYPE_CHECKING:
    from lcmoe.specs.model import ModelSpec


def check_model(spec: ModelSpec) -> None:
    """Raise ValueError on the first field combination Megatron-Core cannot build."""
    _check_attention(spec)
    _check_moe(spec)
    _check_linear_attention(spec)
    if spec.hybrid_layer_pattern is not None:
        _check_hybrid(spec, spec.hybrid_layer_pattern)
    if spec.csa_compress_ratios:
        _check_csa(spec)
    _check_windows_and_patterns(spec)


def _check_attention(spec: ModelSpec) -> None:
    """Heads, query groups, MLA's ranks and DSA's indexer."""
    n = spec.num_attention_heads
    if spec.kv_channels is None and not spec.multi_latent_attention and spec.hidden_size % n:
        # Megatron derives kv_channels = hidden_size // num_attention_heads (arguments.py
        # 1331-1333) only when it divides; otherwise the head dim must be given.
        raise ValueError(
            f"hidden_size = {spec.hidden_size} is not a multiple of num_attention_heads = {n}; "
            "set kv_channels (head_dim) explicitly"
        )
    if spec.num_query_groups is not None and n % spec.num_query_groups:
        raise ValueError(f"num_query_groups = {spec.num_query_groups} must divide num_attention_heads = {n}")
    if spec.multi_latent_attention and not (spec.kv_lora_rank and spec.qk_head_dim and spec.v_head_dim):
        raise ValueError("multi_latent_attention needs kv_lora_rank, qk_head_dim and v_head_dim > 0")
    dsa = (spec.dsa_indexer_n_heads, spec.dsa_indexer_head_dim, spec.dsa_indexer_topk)
    if any(dsa) and not (all(dsa) and spec.multi_latent_attention):
        raise ValueError(
            "DSA needs multi_latent_attention and dsa_indexer_n_heads, dsa_indexer_head_dim and dsa_indexer_topk > 0"
        )


def _check_moe(spec: ModelSpec) -> None:
    """Router top-k and the latent width against the expert count."""
    if spec.num_moe_experts:
        if not 0 < spec.moe_router_topk <= spec.num_moe_experts:
            raise ValueError(
                f"moe_router_topk = {spec.moe_router_topk} must be in 1..num_moe_experts ({spec.num_moe_experts})"
            )
    elif spec.moe_router_topk:
        raise ValueError("moe_router_topk is set but num_moe_experts is not")
    if spec.moe_latent_size and not spec.num_moe_experts:
        raise ValueError("moe_latent_size is set but num_moe_experts is not; latent projections exist only in MoE")


def _check_linear_attention(spec: ModelSpec) -> None:
    """Gated DeltaNet's heads, head dims and convolution."""
    if spec.linear_attention_type == "gdn" and not (
        spec.linear_num_key_heads
        and spec.linear_num_value_heads
        and spec.linear_key_head_dim
        and spec.linear_value_head_dim
        and spec.linear_conv_kernel_dim
    ):
        raise ValueError("gated delta net needs linear key/value heads, head dims and conv kernel > 0")


def _check_hybrid(spec: ModelSpec, pattern: str) -> None:
    """The hybrid ``pattern`` against num_layers, the MTP depths, MoE and the Mamba sizes."""
    layers, mtp, depths = split_hybrid_pattern(pattern)
    if len(layers) != spec.num_layers:
        raise ValueError(
            f"hybrid_layer_pattern has {len(layers)} layers but num_layers = {spec.num_layers}; they must match"
        )
    if depths != spec.mtp_num_layers:
        raise ValueError(
            f"hybrid_layer_pattern has {depths} MTP depths but mtp_num_layers = {spec.mtp_num_layers}; they must match"
        )
    if mtp and (
        len(mtp) > 2
        or sum(s in (HYBRID_MAMBA, HYBRID_ATTENTION) for s in mtp) > 1
        or sum(s in (HYBRID_MLP, HYBRID_MOE) for s in mtp) > 1
    ):
        raise ValueError(
            f"hybrid MTP depth {mtp!r} is not modelled; lcmoe models one mixer and one MLP per depth (e.g. '*E')"
        )
    if (HYBRID_MOE in layers + mtp) != spec.is_moe:
        raise ValueError("hybrid_layer_pattern has E (MoE) layers exactly when num_moe_experts is set")
    if HYBRID_MAMBA in layers + mtp:
        heads, groups = spec.mamba_num_heads, spec.mamba_num_groups
        if not (heads and spec.mamba_head_dim and spec.mamba_state_dim and groups):
            raise ValueError(
                "Mamba layers need mamba_num_heads, mamba_head_dim, mamba_state_dim and mamba_num_groups > 0"
            )
        if heads % groups:
            raise ValueError(f"mamba_num_groups = {groups} must divide mamba_num_heads = {heads}")
    if spec.multi_latent_attention or spec.linear_attention_type is not None:
        raise ValueError("hybrid_layer_pattern models use '*' attention layers; MLA and GDN are not modelled there")


def _check_csa(spec: ModelSpec) -> None:
    """DeepSeek-V4's per-layer compress ratios and grouped output projection."""
    ratios, expected = spec.csa_compress_ratios, spec.num_layers + spec.mtp_num_layers
    if len(ratios) != expected:
        raise ValueError(
            f"csa_compress_ratios has {len(ratios)} entries; it needs num_layers + mtp_num_layers = {expected} "
            "(Bridge deepseek_v4_bridge.py _dsv4_compress_ratios)"
        )
    if any(r < 0 or r == 1 for r in ratios):
        raise ValueError("csa_compress_ratios entries must be 0 (window only) or a ratio ≥ 2, e.g. 4 or 128")
    if not (spec.multi_latent_attention and spec.q_lora_rank and spec.o_groups and spec.o_lora_rank):
        raise ValueError("CSA needs multi_latent_attention, q_lora_rank, o_groups and o_lora_rank > 0")
    if spec.num_attention_heads % spec.o_groups:
        raise ValueError(f"o_groups = {spec.o_groups} must divide num_attention_heads = {spec.num_attention_heads}")
    if 4 in ratios and not spec.is_dsa:
        raise ValueError("CSA layers of ratio 4 hold a DSA indexer: set dsa_indexer_n_heads, _head_dim and _topk")
    if spec.hybrid_layer_pattern is not None or spec.linear_attention_type is not None:
        raise ValueError("CSA (DeepSeek-V4) is not modelled together with hybrid or linear-attention layers")


def _check_windows_and_patterns(spec: ModelSpec) -> None:
    """The sliding window, the recipe layouts' keys and the per-layer 0/1 patterns."""
    if spec.window_size is not None and (spec.window_size[0] < 0 or spec.window_size[1] < 0):
        raise ValueError(f"window_size = {spec.window_size} must be two non-negative numbers")
    for key in spec.recipe_pipeline_layouts:
        if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", key):
            raise ValueError(f"recipe_pipeline_layouts key {key!r} must be PPxVPP, e.g. 4x4")
    for field in ("moe_layer_freq", "window_attn_skip_freq", "linear_attention_freq"):
        pattern = getattr(spec, field)
        if isinstance(pattern, list):
            if len(pattern) != spec.num_layers or any(v not in (0, 1) for v in pattern):
                raise ValueError(f"{field} as a list must have num_layers = {spec.num_layers} entries of 0 or 1")
        elif pattern is not None and pattern <= 0:
            raise ValueError(f"{field} = {pattern} must be a positive period")
