"""Model FLOPs exactly as Megatron Bridge counts them for its "TFLOP/s/GPU" log line.

Source: ``src/megatron/bridge/training/utils/flop_utils.py:947-1571`` (``transformer_flops``),
transcribed in megatron-bridge-facts.md §4. Conventions (facts §4.1):

* a multiply-add is 2 FLOPs, and training = forward (×1) + backward (×2), so every matmul of
  an (a×b) weight costs ``6·a·b`` FLOPs per token;
* causal core attention is halved; recompute is never counted; MoE counts top-k experts only;
* the logit layer uses the vocabulary padded for TP, so the number depends on TP;
* the router, norms (except MLA/MTP norms that Bridge counts) and softmax are not counted.

Per token at fixed sequence length s (``ŝ = S2/S1 = s``):
``F/token = MLP + A + MTP-projection + logits`` with the terms below. Hybrid Mamba models
(``hybrid_layer_pattern``) take Bridge's separate hybrid path (flop_utils.py:801-945,
1587-1655): layers counted by symbol over the main pattern and the MTP depths, no MTP
projection term, and Bridge's own Mamba count (``hybrid_flops_per_token``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.params import attention_kind
from lcmoe.specs.model import AttentionKind, ModelSpec


@dataclass(frozen=True, slots=True)
class FlopsBreakdown:
    """Training FLOPs per token (forward + backward) by term; ``total`` is their sum."""

    dense_mlp: float
    routed_experts: float
    shared_experts: float
    attention_projections: float
    attention_core: float
    linear_attention: float
    mtp_projection: float
    logits: float
    mamba: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.attention_projections
            + self.attention_core
            + self.linear_attention
            + self.mtp_projection
            + self.logits
            + self.mamba
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "dense_mlp": self.dense_mlp,
            "routed_experts": self.routed_experts,
            "shared_experts": self.shared_experts,
            "attention_projections": self.attention_projections,
            "attention_core": self.attention_core,
            "linear_attention": self.linear_attention,
            "mtp_projection": self.mtp_projection,
            "logits": self.logits,
            "mamba": self.mamba,
        }


def layer_counts(spec: ModelSpec) -> tuple[int, int]:
    """(N_dense, N_moe) including MTP layers, which take the last decoder layer's type
    (flop_utils.py:1008-1043)."""
    pattern = spec.moe_layer_pattern()
    n_moe = sum(pattern) + (spec.mtp_num_layers if pattern[-1] else 0)
    return spec.total_layers - n_moe, n_moe


def expert_gemm_flops_per_moe_layer(spec: ModelSpec) -> float:
    """The k routed experts' GEMMs of one MoE layer per token: 6·e·d_e·f_moe·k, d_e = h or, for
    LatentMoE, the latent width."""
    return 6.0 * spec.glu_factor * spec.expert_width * spec.expert_ffn * spec.moe_router_topk


def latent_projection_flops_per_moe_layer(spec: ModelSpec) -> float:
    """LatentMoE's h→d_l and d_l→h projections per token: 12·h·d_l; 0 without."""
    return 12.0 * spec.hidden_size * spec.moe_latent_size if spec.moe_latent_size else 0.0


def routed_flops_per_moe_layer(spec: ModelSpec) -> float:
    """Routed experts of one MoE layer per token as Bridge counts them: the expert GEMMs plus,
    for LatentMoE, its two projections (flop_utils.py:1530-1540, the transformer path's
    f_moe·k·e·d_l/h + 2·d_l times 6h; the hybrid path's moe_layer_flops, :708-731, counts the
    same)."""
    return expert_gemm_flops_per_moe_layer(spec) + latent_projection_flops_per_moe_layer(spec)


def mlp_flops_per_token(spec: ModelSpec) -> tuple[float, float, float]:
    """(dense, routed, shared) = (6·h·e·ffn·N_dense, routed_flops_per_moe_layer·N_moe,
    6·h·e·f_sh·N_moe), e = 3 with GLU (flop_utils.py:1523-1571)."""
    n_dense, n_moe = layer_counts(spec)
    h, e = spec.hidden_size, spec.glu_factor
    dense = 6.0 * h * e * spec.ffn_hidden_size * n_dense
    routed = routed_flops_per_moe_layer(spec) * n_moe
    shared = 6.0 * h * e * spec.shared_ffn * n_moe
    return dense, routed, shared


def mla_projection_flops_per_layer(spec: ModelSpec) -> float:
    """One MLA layer's projections per token, 6·(q + kv + o) (flop_utils.py:1302-1348, and its DSA
    branch): q = rq·(h + n·(dn+dr) + 1) (or h·n·(dn+dr) without q LoRA; the +1 is the q norm);
    kv = rkv·(h + n·(dn+dv) + 1) + h·dr; o = n·dv·h."""
    h, n = spec.hidden_size, spec.num_attention_heads
    dn, dr, dv = spec.qk_head_dim, spec.qk_pos_emb_head_dim, spec.v_head_dim
    rq, rkv = spec.q_lora_rank, spec.kv_lora_rank
    q_term = rq * (h + n * (dn + dr) + 1) if rq else h * n * (dn + dr)
    kv_term = rkv * (h + n * (dn + dv) + 1) + h * dr
    return 6.0 * (q_term + kv_term + n * dv * h)


def mla_core_flops_per_layer(spec: ModelSpec, seq_len: float) -> float:
    """One MLA layer's core attention per token: 6·(ŝ·n·(dn+dr)/2 + ŝ·n·dv/2), causal halves."""
    n, dn, dr, dv = spec.num_attention_heads, spec.qk_head_dim, spec.qk_pos_emb_head_dim, spec.v_head_dim
    return 6.0 * (seq_len * n * (dn + dr) / 2 + seq_len * n * dv / 2)


def mla_flops_per_token(spec: ModelSpec, seq_len: float) -> tuple[float, float]:
    """MLA, every decoder and MTP layer: L_t × (projections, core)."""
    layers = spec.total_layers
    return layers * mla_projection_flops_per_layer(spec), layers * mla_core_flops_per_layer(spec, seq_len)


def dsa_contexts(spec: ModelSpec, seq_len: float) -> tuple[float, float]:
    """(dense, sparse) causal context per token of a DSA layer (flop_utils.py DSA branch, after
    arXiv 2512.02556 eqs. 1-2): every causal pair, (ŝ + 1)/2, and the top-k pairs the sparse core
    reads, k − k(k − 1)/(2ŝ) once ŝ > k (all causal pairs below)."""
    dense = (seq_len + 1) / 2
    k = spec.dsa_indexer_topk
    sparse = dense if seq_len <= k else k - k * (k - 1) / (2 * seq_len)
    return dense, sparse


def dsa_layer_flops_per_token(spec: ModelSpec, seq_len: float, *, indexer: bool) -> tuple[float, float]:
    """(projections, core) of one DSA layer per token, Bridge's DSA branch split per layer
    (flop_utils.py, ``experimental_attention_variant == "dsa"``):

    - projections: the MLA ones (``mla_projection_flops_per_layer``); an indexer layer adds
      its projections (rq·ni·di + h·di + h·ni) × 4 when the indexer trains (loss coefficient > 0:
      forward and weight gradient of detached inputs) or × 2 (forward only);
    - core: absorbed-MLA attention over the sparse context, 6·c_sparse·n·((rkv + dr) + rkv); an
      indexer layer adds its dense scoring 2·c_dense·ni·(di + 1), the scores' backward
      4·c·ni·(di + 1) and the attention target 2·c·n·(rkv + dr) when it trains (c the sparse
      context with the sparse KL loss, else the dense one)."""
    h, n, dr = spec.hidden_size, spec.num_attention_heads, spec.qk_pos_emb_head_dim
    rq, rkv = spec.q_lora_rank, spec.kv_lora_rank
    ni, di = spec.dsa_indexer_n_heads, spec.dsa_indexer_head_dim
    projections = mla_projection_flops_per_layer(spec)
    dense_ctx, sparse_ctx = dsa_contexts(spec, seq_len)
    core = 6.0 * sparse_ctx * n * ((rkv + dr) + rkv)
    if indexer:
        trains = spec.dsa_indexer_loss_coeff > 0
        projections += (4.0 if trains else 2.0) * ((rq or h) * ni * di + h * di + h * ni)
        core += 2.0 * dense_ctx * ni * (di + 1)
        if trains:
            context = sparse_ctx if spec.dsa_indexer_use_sparse_loss else dense_ctx
            core += 4.0 * context * ni * (di + 1) + 2.0 * context * n * (rkv + dr)
    return projections, core


def dsa_flops_per_token(spec: ModelSpec, seq_len: float) -> tuple[float, float]:
    """DSA models: every decoder and MTP layer's ``dsa_layer_flops_per_token``, indexer layers
    counted over the decoder numbering and each MTP block's own (1..m), as Bridge counts them."""
    indexers = sum(spec.has_dsa_indexer(i) for i in range(spec.num_layers))
    indexers += sum(spec.dsa_computes_topk(i) for i in range(1, spec.mtp_num_layers + 1))
    plain = dsa_layer_flops_per_token(spec, seq_len, indexer=False)
    with_indexer = dsa_layer_flops_per_token(spec, seq_len, indexer=True)
    others = spec.total_layers - indexers
    return (
        others * plain[0] + indexers * with_indexer[0],
        others * plain[1] + indexers * with_indexer[1],
    )


def gqa_projection_per_layer(spec: ModelSpec) -> float:
    """proj = h·(q + 2·kv + gate) + q·h, q = d·n, kv = d·g, gate = q with output gate
    (flop_utils.py:1350-1410)."""
    q = spec.head_dim * spec.num_attention_heads
    kv = spec.head_dim * spec.query_groups
    gate = q if spec.attention_output_gate else 0
    return float(spec.hidden_size * (q + 2 * kv + gate) + q * spec.hidden_size)


def swa_context(spec: ModelSpec, seq_len: int, core_len: float | None = None) -> float:
    """Average attended keys per query under a causal window: c = W − W(W−1)/(2s) if W < s,
    else ŝ/2 (flop_utils.py:559-570): s is the sample width S1/batch, ŝ = S2/S1 the attention
    length factor (``core_len``; = s for fixed-length samples)."""
    w = spec.window_tokens
    return w - w * (w - 1) / (2 * seq_len) if w < seq_len else (seq_len if core_len is None else core_len) / 2


def gdn_flops_per_layer(spec: ModelSpec) -> float:
    """Gated DeltaNet layer: 6·(h·in_proj + conv·(2·qk + vd) + nv·dv²·4 + h·vd),
    in_proj = 2·qk + 2·vd + 2·nv; independent of s (flop_utils.py:1410-1470)."""
    h = spec.hidden_size
    qk = spec.linear_key_head_dim * spec.linear_num_key_heads
    nv, dv = spec.linear_num_value_heads, spec.linear_value_head_dim
    vd = dv * nv
    in_proj = 2 * qk + 2 * vd + 2 * nv
    return 6.0 * (h * in_proj + spec.linear_conv_kernel_dim * (2 * qk + vd) + nv * dv * dv * 4 + h * vd)


def gqa_flops_per_token(spec: ModelSpec, seq_len: int, core_len: float | None = None) -> tuple[float, float, float]:
    """(projections, core, linear-attention) for GQA/MHA models with optional sliding window
    and Gated DeltaNet layers. Full layer core = q·ŝ (``core_len``, default s); SWA layer core =
    2·q·c; MTP layers take the last decoder layer's kind."""
    core_len = seq_len if core_len is None else core_len
    proj = gqa_projection_per_layer(spec)
    q = spec.head_dim * spec.num_attention_heads
    mtp = spec.mtp_num_layers
    gdn_pattern = spec.linear_attention_pattern()
    n_gdn = sum(gdn_pattern) + (mtp if gdn_pattern[-1] else 0)
    swa_pattern = spec.sliding_window_pattern()
    n_swa = sum(swa_pattern) + (mtp if swa_pattern[-1] else 0)
    n_std = spec.total_layers - n_gdn
    n_full = n_std - n_swa
    swa_core = n_swa * 2 * q * swa_context(spec, seq_len, core_len) if n_swa else 0.0
    core = 6.0 * (n_full * q * core_len + swa_core)
    projections = 6.0 * n_std * proj
    linear = n_gdn * gdn_flops_per_layer(spec)
    return projections, core, linear


def mtp_projection_flops_per_token(spec: ModelSpec) -> float:
    """6·m·(3h + 2h²): per MTP layer, 3 norms and the 2h→h eh projection (flop_utils.py:1523-1571)."""
    h = spec.hidden_size
    return 6.0 * spec.mtp_num_layers * (3 * h + 2 * h * h)


def logits_flops_per_token(spec: ModelSpec, tp: int = 1) -> float:
    """6·h·V·(m + 1) with V padded for TP (vocab_utils.py:45-59): main head and each MTP head."""
    return 6.0 * spec.hidden_size * spec.padded_vocab_size(tp) * (spec.mtp_num_layers + 1)


def bridge_mamba_flops_per_layer(spec: ModelSpec) -> float:
    """Bridge's Mamba layer count, ×3 for training (flop_utils.py:801-826 mamba_layer_flops):
    3·[2h·(2·d_in + 2·G·N + nh) + 7·d_in·N + 2·d_in·h] with d_in = 2h — Bridge's d_in is 2h,
    not nh·hd, so its count exceeds the mixer's GEMMs when nh·hd < 2h (Nemotron-3 Nano: 4096
    vs 5376); lcmoe repeats it so its TFLOP/s match the logged ones."""
    h, state, groups, heads = spec.hidden_size, spec.mamba_state_dim, spec.mamba_num_groups, spec.mamba_num_heads
    d_in = 2 * h
    return 3.0 * (2 * h * (2 * d_in + 2 * groups * state + heads) + 7 * d_in * state + 2 * d_in * h)


def hybrid_flops_per_token(
    spec: ModelSpec, seq_len: int, *, tp: int = 1, core_len: float | None = None
) -> FlopsBreakdown:
    """Bridge's hybrid path per token (flop_utils.py:849-945): with counts N_sym over main layers
    and MTP depths, 3·[N_attn·(4h·q·(1 + g/n) + 2q·ŝ) + N_mlp·4·ffn·h·(1.5 if GLU)
    + N_mamba·mamba + N_moe·4h·(f_moe·k + f_sh)·(1.5 if GLU) + 2h·V·(1 + m)] (routed experts as
    ``routed_flops_per_moe_layer``, which LatentMoE changes); SWA layers use
    2c for ŝ. Per-layer attention/MLP terms equal the transformer path's except that the
    attention output gate is not counted; neither is the MTP eh projection."""
    counts = spec.hybrid_layer_counts()
    h, e = spec.hidden_size, spec.glu_factor
    n_attn = counts["*"]
    # Bridge numbers SWA layers by position in the main pattern; MTP attention stays full.
    n_swa = sum(attention_kind(spec, i) is AttentionKind.SWA for i in range(spec.num_layers))
    q = spec.head_dim * spec.num_attention_heads
    kv = spec.head_dim * spec.query_groups
    projections = 6.0 * n_attn * (h * (q + 2 * kv) + q * h)
    core_len = seq_len if core_len is None else core_len
    swa_core = n_swa * 2 * q * swa_context(spec, seq_len, core_len) if n_swa else 0.0
    core = 6.0 * ((n_attn - n_swa) * q * core_len + swa_core)
    return FlopsBreakdown(
        dense_mlp=6.0 * h * e * spec.ffn_hidden_size * counts["-"],
        routed_experts=routed_flops_per_moe_layer(spec) * counts["E"],
        shared_experts=6.0 * h * e * spec.shared_ffn * counts["E"],
        attention_projections=projections,
        attention_core=core,
        linear_attention=0.0,
        mtp_projection=0.0,
        logits=logits_flops_per_token(spec, tp),
        mamba=counts["M"] * bridge_mamba_flops_per_layer(spec),
    )


def flops_per_token(spec: ModelSpec, seq_len: int, *, tp: int = 1, core_len: float | None = None) -> FlopsBreakdown:
    """Bridge's model FLOPs per token for samples of ``seq_len`` tokens. ``core_len`` is Bridge's
    attention length factor ŝ = S2/S1 = Σ sᵢ²/Σ tokens (flop_utils.py:465-483): None for
    fixed-length samples (ŝ = s); for packed THD samples Σ sᵢ² runs over the real documents
    (``accumulate_flops_metadata``, flop_utils.py:258-360). Full-attention, MLA and DSA cores
    use ŝ; a sliding window keeps s unless the window is longer (``swa_context``)."""
    core = seq_len if core_len is None else core_len
    if spec.is_hybrid:
        return hybrid_flops_per_token(spec, seq_len, tp=tp, core_len=core_len)
    dense, routed, shared = mlp_flops_per_token(spec)
    if spec.is_dsa:
        projections, core = dsa_flops_per_token(spec, core)
        linear = 0.0
    elif spec.multi_latent_attention:
        projections, core = mla_flops_per_token(spec, core)
        linear = 0.0
    else:
        projections, core, linear = gqa_flops_per_token(spec, seq_len, core_len)
    return FlopsBreakdown(
        dense_mlp=dense,
        routed_experts=routed,
        shared_experts=shared,
        attention_projections=projections,
        attention_core=core,
        linear_attention=linear,
        mtp_projection=mtp_projection_flops_per_token(spec),
        logits=logits_flops_per_token(spec, tp),
    )


def lora_model_flops_per_token(breakdown: FlopsBreakdown) -> float:
    """Model FLOPs per token of a LoRA run: the frozen GEMMs at 2/3 of their training count
    (forward and data gradient, no weight gradient) and core attention in full,
    total − (total − attention_core)/3 — Bridge's own LoRA count where it has one
    (flop_utils.py, Llama3-70B on packed SQuAD: ``model_flops_frozen · 2/3 +
    model_flops_unfrozen``; its other LoRA runs log the full-training count). Adapter GEMMs
    (6·r·(in + out) per token each) are left out, as Bridge does."""
    return breakdown.total - (breakdown.total - breakdown.attention_core) / 3


def flops_per_step(spec: ModelSpec, seq_len: int, global_batch_size: int, *, tp: int = 1) -> float:
    """F = GBS·s·(FLOPs per token): what Bridge divides by step time and world size."""
    return global_batch_size * seq_len * flops_per_token(spec, seq_len, tp=tp).total
