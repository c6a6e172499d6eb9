"""Per-layer FLOPs per token (forward + backward, Bridge's conventions), split by the kernel kind
that runs them, and the GDN / Mamba counts that run at their own kernels' rates."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.flops import (
    dsa_layer_flops_per_token,
    expert_gemm_flops_per_moe_layer,
    gdn_flops_per_layer,
    gqa_projection_per_layer,
    latent_projection_flops_per_moe_layer,
    mla_core_flops_per_layer,
    mla_projection_flops_per_layer,
    swa_context,
)
from lcmoe.estimate.params import attention_kind
from lcmoe.specs.model import AttentionKind, ModelSpec


# ----- per-layer FLOPs (one token, forward + backward, Bridge's conventions) -----------------
@dataclass(frozen=True, slots=True)
class LayerFlops:
    dense_gemm: float
    expert_gemm: float
    attention_core: float
    linear_attention: float
    up_projection: float  # MLA q/kv up-projections (what mla_up_proj recompute replays)
    dense_mlp: float
    mamba_scan: float = 0.0


def layer_flops_per_token(
    model: ModelSpec, layer: int, seq_len: int, *, core_len: float | None = None, window_len: float | None = None
) -> LayerFlops:
    """The per-layer split of ``estimate.flops`` (same formulas, one layer). A Mamba mixer counts
    its GEMMs as they run (mamba_gemm_flops_per_layer, not Bridge's 2h count) and its chunked
    scan apart (mamba_scan_flops_per_layer), which runs at its own rate. ``core_len``: the
    attention length per token ŝ = E[Σ dᵢ²]/S of packed documents (None: s, fixed length);
    ``window_len``: a sliding-window layer's 2·c̄ over those documents (None: Bridge's 2·c at s)."""
    core_seq = seq_len if core_len is None else core_len
    h, e = model.hidden_size, model.glu_factor
    kind = attention_kind(model, layer)
    up = 0.0
    linear = 0.0
    scan = 0.0
    if kind is AttentionKind.NONE:
        proj, core = 0.0, 0.0
    elif kind is AttentionKind.MAMBA:
        proj, core = mamba_gemm_flops_per_layer(model), 0.0
        scan = mamba_scan_flops_per_layer(model)
    elif kind is AttentionKind.MLA:
        n, dn, dr, dv = model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        rq, rkv = model.q_lora_rank, model.kv_lora_rank
        up = 6.0 * ((rq or 0) * n * (dn + dr) + rkv * n * (dn + dv))
        if model.is_dsa:
            proj, core = dsa_layer_flops_per_token(model, core_seq, indexer=model.has_dsa_indexer(layer))
        else:
            proj, core = mla_projection_flops_per_layer(model), mla_core_flops_per_layer(model, core_seq)
    elif kind is AttentionKind.GDN:
        proj, core = 0.0, 0.0
        # The projections and conv run as GEMMs; the chunked delta-rule recurrence runs at its
        # kernel's measured rate (gdn_kernel_seconds), so its FLOPs leave the GEMM amount.
        linear = gdn_flops_per_layer(model) - gdn_recurrence_flops_per_layer(model)
    else:
        proj = 6.0 * gqa_projection_per_layer(model)
        q = model.head_dim * model.num_attention_heads
        if kind is AttentionKind.SWA:
            context = 2 * swa_context(model, seq_len, core_len) if window_len is None else window_len
        else:
            context = core_seq
        core = 6.0 * q * context
    if model.is_moe_layer(layer):
        # LatentMoE's projections are dense (replicated) GEMMs; its experts work in the latent width.
        mlp_dense = 6.0 * h * e * model.shared_ffn + latent_projection_flops_per_moe_layer(model)
        experts = expert_gemm_flops_per_moe_layer(model)
    elif model.has_mlp(layer):
        mlp_dense = 6.0 * h * e * model.ffn_hidden_size
        experts = 0.0
    else:
        mlp_dense, experts = 0.0, 0.0
    return LayerFlops(proj + mlp_dense, experts, core, linear, up, mlp_dense, scan)


def mamba_gemm_flops_per_layer(model: ModelSpec) -> float:
    """in_proj and out_proj as the mixer runs them: 6·h·(2·d_i + 2·G·N + nh) + 6·d_i·h
    (mamba_mixer.py:281-450)."""
    h = model.hidden_size
    return 6.0 * (h * model.mamba_in_proj_size + model.mamba_inner_size * h)


def gdn_recurrence_flops_per_layer(model: ModelSpec) -> float:
    """The chunked delta-rule part of Bridge's Gated DeltaNet count, 6 · nv · dv² · 4 per token
    (flop_utils.py:1410-1470, the ``nv·dv²·4`` term of gdn_flops_per_layer)."""
    return 6.0 * model.linear_num_value_heads * model.linear_value_head_dim**2 * 4


def gdn_token_heads(tokens: float, model: ModelSpec) -> float:
    """(tokens × GDN value heads) in units of a 128 × 128 head state: tokens · nv · dk · dv / 128²
    (the FLA D = 256 row, 16.5 ns, is 2.75× the D = 128 rate for 4× the state, so scaling with
    the state is on the slow side)."""
    state = model.linear_key_head_dim * model.linear_value_head_dim / (128 * 128)
    return tokens * model.linear_num_value_heads * state


def mamba_scan_flops_per_layer(model: ModelSpec) -> float:
    """Chunked SSD scan (Dao & Gu 2024, "Transformers are SSMs", §6), per token forward: the
    intra-chunk C·Bᵀ (2·Q·G·N) and its product with X (2·Q·d_i), the chunk states Bᵀ·X and their
    read-out C·state (2·2·N·d_i); ×3 for training. Q = mamba_chunk_size."""
    q, state, d_inner = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_inner_size
    return 3.0 * (2 * q * (model.mamba_num_groups * state + d_inner) + 4 * state * d_inner)
