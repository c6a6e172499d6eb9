"""Parameter counts per layer, split into dense (replicated over EP, sharded over TP) and
routed-expert (sharded over EP×ETP) parameters.

Counts follow the module structure of Megatron-Core's layers (weights and biases; buffers such
as the router expert bias are not parameters). Symbols as in ``lcmoe.specs.model``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Defined with the spec (lcmoe.specs.layers); re-exported for the estimators that import them from here.
from lcmoe.specs.layers import LayerSignature as LayerSignature
from lcmoe.specs.layers import attention_kind as attention_kind
from lcmoe.specs.layers import layer_signature as layer_signature
from lcmoe.specs.layers import mixer_kind
from lcmoe.specs.model import AttentionKind, ModelSpec


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer. ``dense`` is every non-routed-expert parameter."""

    attention: int
    mlp_dense: int
    routed_experts: int
    is_moe: bool
    attention_kind: AttentionKind
    # Dense parameters every TP rank holds in full: LatentMoE's projections are TELinear with
    # parallel_mode="duplicated" (moe_layer.py:266-300).
    tp_replicated: int = 0

    @property
    def dense(self) -> int:
        return self.attention + self.mlp_dense


def gqa_attention_params(spec: ModelSpec) -> int:
    """q: h·n·d (×2 with output gate), k,v: 2·h·g·d, o: n·d·h; + qkv/o biases, qk-norm 2d,
    sinks n, input norm h."""
    h, n, g, d = spec.hidden_size, spec.num_attention_heads, spec.query_groups, spec.head_dim
    q_out = n * d * (2 if spec.attention_output_gate else 1)
    params = h * (q_out + 2 * g * d) + n * d * h + h
    if spec.add_qkv_bias:
        params += q_out + 2 * g * d
    if spec.add_bias_linear:
        params += h
    if spec.qk_layernorm:
        params += 2 * d
    if spec.softmax_sinks:
        params += n
    return params


def mla_attention_params(spec: ModelSpec) -> int:
    """q: h·rq + rq + rq·n·(dn+dr) (or h·n·(dn+dr) without q LoRA); kv down: h·(rkv+dr) + rkv;
    kv up: rkv·n·(dn+dv); o: n·dv·h; input norm h."""
    h, n = spec.hidden_size, spec.num_attention_heads
    dn, dr, dv, rkv = spec.qk_head_dim, spec.qk_pos_emb_head_dim, spec.v_head_dim, spec.kv_lora_rank
    rq = spec.q_lora_rank
    q = (h * rq + rq + rq * n * (dn + dr)) if rq else h * n * (dn + dr)
    kv = h * (rkv + dr) + rkv + rkv * n * (dn + dv)
    return q + kv + n * dv * h + h


def dsa_indexer_params(spec: ModelSpec) -> int:
    """The lightning indexer of one DSA layer (dsa.py ``DSAIndexer``): linear_wq_b from the query
    latent rq (or h without q LoRA) to ni·di, linear_wk h → di, its LayerNorm k_norm (weight and
    bias, 2·di), linear_weights_proj h → ni. Only layers that compute top-k hold one
    (``ModelSpec.has_dsa_indexer``). GLM-5.2: 2048·32·128 + 6144·128 + 256 + 6144·32 = 9 371 904
    per indexer; with one in 21 of its 78 layers plus the MTP layer this reproduces the 753 329 940
    480 elements of its checkpoint exactly (model_verification_cards/glm5-2/card.yaml)."""
    h, ni, di = spec.hidden_size, spec.dsa_indexer_n_heads, spec.dsa_indexer_head_dim
    return (spec.q_lora_rank or h) * ni * di + h * di + 2 * di + h * ni


def gdn_attention_params(spec: ModelSpec) -> int:
    """Gated DeltaNet: in_proj h·(2·qk + 2·vd + 2·nv), conv (2·qk+vd)·kernel, A_log + dt_bias 2·nv,
    output norm dv, out_proj vd·h, input norm h (qk = nk·dk, vd = nv·dv)."""
    h = spec.hidden_size
    qk = spec.linear_num_key_heads * spec.linear_key_head_dim
    nv = spec.linear_num_value_heads
    vd = nv * spec.linear_value_head_dim
    conv = (2 * qk + vd) * spec.linear_conv_kernel_dim
    return h * (2 * qk + 2 * vd + 2 * nv) + conv + 2 * nv + spec.linear_value_head_dim + vd * h + h


def csa_attention_params(spec: ModelSpec) -> int:
    """DeepSeek-V4 attention common to every layer (reference inference/model.py ``Attention``,
    mapped by Bridge deepseek_v4_bridge.py): wq_a h·rq + q_norm rq + wq_b rq·n·D; one shared KV
    head wkv h·D + kv_norm D; grouped output wo_a (n·D/g_o)·(g_o·r_o) + wo_b g_o·r_o·h; attn_sink
    n; input norm h. DeepSeek-V4-Flash: 107 M per layer."""
    h, n, d, rq = spec.hidden_size, spec.num_attention_heads, spec.v_head_dim, spec.q_lora_rank or 0
    grouped = spec.o_groups * spec.o_lora_rank
    return h * rq + rq + rq * n * d + h * d + d + (n * d // spec.o_groups) * grouped + grouped * h + n + h


def csa_compressor_params(spec: ModelSpec, ratio: int, width: int) -> int:
    """One KV compressor of ratio r over width w (reference ``Compressor``): overlapping windows
    (c = 2) at r = 4, else c = 1; ape r·c·w, wkv and wgate h·c·w each, norm w."""
    c = 2 if ratio == 4 else 1
    return ratio * c * width + 2 * spec.hidden_size * c * width + width


def csa_indexer_params(spec: ModelSpec) -> int:
    """The indexer of a ratio-4 CSA layer (reference ``Indexer``): wq_b rq·ni·di from the query
    latent, weights_proj h·ni, and its own ratio-4 compressor of width di."""
    ni, di = spec.dsa_indexer_n_heads, spec.dsa_indexer_head_dim
    return (spec.q_lora_rank or 0) * ni * di + spec.hidden_size * ni + csa_compressor_params(spec, 4, di)


def csa_layer_extra_params(spec: ModelSpec, layer: int) -> int:
    """What a CSA layer holds beyond ``csa_attention_params``: a compressor of width D where
    r > 0, and an indexer where r = 4 (DeepSeek-V4-Flash: 19.1 M at r = 4, 4.3 M at r = 128)."""
    ratio = spec.csa_compress_ratio(layer)
    if not ratio:
        return 0
    indexer = csa_indexer_params(spec) if ratio == 4 else 0
    return csa_compressor_params(spec, ratio, spec.v_head_dim) + indexer


def hyper_connection_params(spec: ModelSpec) -> int:
    """One mHC module (hyper_connection.py:182-193): mapping_proj n_hc·h·(n_hc² + 2·n_hc), no
    bias; its static bias n_hc² + 2·n_hc; alpha_pre/post/res 3. A layer has one per sublayer (the
    checkpoint's hc_attn_* and hc_ffn_*); 0 without hyper-connections."""
    n = spec.mhc_num_residual_streams
    mix = n * n + 2 * n
    return n * spec.hidden_size * mix + mix + 3 if n else 0


def hyper_connection_head_params(spec: ModelSpec) -> int:
    """The learned contraction of the n_hc streams before an output head (the checkpoint's
    hc_head_fn n_hc·(n_hc·h), hc_head_base n_hc, hc_head_scale 1; one more per MTP layer, Bridge
    docs/models/deepseek/deepseek-v4.md:35)."""
    n = spec.mhc_num_residual_streams
    return n * n * spec.hidden_size + n + 1 if n else 0


def mamba_mixer_params(spec: ModelSpec) -> int:
    """Mamba-2 mixer (mamba_mixer.py:281-450): in_proj h·(2·d_i + 2·G·N + nh) with its fused
    input norm h; conv1d (d_i + 2·G·N)·(W + 1) (weight and bias); dt_bias, A_log, D nh each;
    gated RMSNorm d_i; out_proj d_i·h (no biases: ``assert not bias``)."""
    h, d_inner, heads = spec.hidden_size, spec.mamba_inner_size, spec.mamba_num_heads
    in_proj = h * spec.mamba_in_proj_size + h
    conv = (d_inner + 2 * spec.mamba_num_groups * spec.mamba_state_dim) * (spec.mamba_conv_kernel_dim + 1)
    return in_proj + conv + 3 * heads + d_inner + d_inner * h


def attention_params(spec: ModelSpec, kind: AttentionKind) -> int:
    if kind is AttentionKind.MLA:
        return mla_attention_params(spec)
    if kind is AttentionKind.GDN:
        return gdn_attention_params(spec)
    if kind is AttentionKind.MAMBA:
        return mamba_mixer_params(spec)
    if kind is AttentionKind.CSA:
        return csa_attention_params(spec)
    if kind is AttentionKind.NONE:
        return 0
    return gqa_attention_params(spec)


def dense_mlp_params(spec: ModelSpec, ffn: int) -> int:
    """glu·h·ffn (+ biases (glu−1)·ffn + h) + pre-MLP norm h."""
    h, glu = spec.hidden_size, spec.glu_factor
    bias = (glu - 1) * ffn + h if spec.add_bias_linear else 0
    return glu * h * ffn + bias + h


def expert_params(spec: ModelSpec) -> int:
    """One routed expert: glu·d_e·f_moe (+ biases (glu−1)·f_moe + d_e when experts have biases),
    d_e = h, or moe_latent_size for LatentMoE (experts.py:219-242)."""
    d, glu, f = spec.expert_width, spec.glu_factor, spec.expert_ffn
    bias = (glu - 1) * f + d if spec.moe_expert_bias else 0
    return glu * d * f + bias


def latent_projection_params(spec: ModelSpec) -> int:
    """LatentMoE's down and up projections around dispatch: 2·h·d_l (+ biases d_l + h)
    (moe_layer.py:266-300 ``fc1_latent_proj`` h→d_l, ``fc2_latent_proj`` d_l→h); 0 without."""
    if not spec.moe_latent_size:
        return 0
    h, latent = spec.hidden_size, spec.moe_latent_size
    return 2 * h * latent + (latent + h if spec.add_bias_linear else 0)


def moe_dense_params(spec: ModelSpec) -> int:
    """Non-routed part of a MoE layer: router h·E (+E bias), shared expert glu·h·f_sh (+ gate h;
    it runs on the full width, moe_layer.py:428-436), LatentMoE projections
    (``latent_projection_params``), pre-MLP norm h."""
    h, num_experts = spec.hidden_size, spec.num_moe_experts or 0
    router = h * num_experts + (num_experts if spec.add_bias_linear else 0)
    shared = spec.glu_factor * h * spec.shared_ffn
    gate = h if spec.moe_shared_expert_gate and spec.shared_ffn else 0
    return router + shared + gate + latent_projection_params(spec) + h


def layer_params(spec: ModelSpec, layer: int) -> LayerParams:
    """Parameters of decoder layer ``layer``; for MTP layers pass ``spec.mtp_layer``. Each
    sublayer's hyper-connection module counts with it (attention's with attention, the MLP's with
    the MLP)."""
    kind = mixer_kind(spec, layer)
    is_moe = spec.is_moe_layer(layer)
    replicated = 0
    if is_moe:
        mlp, experts = moe_dense_params(spec), (spec.num_moe_experts or 0) * expert_params(spec)
        replicated = latent_projection_params(spec)
    elif not spec.has_mlp(layer):
        mlp, experts = 0, 0
    else:
        mlp, experts = dense_mlp_params(spec, spec.ffn_hidden_size), 0
    if kind is AttentionKind.CSA:
        attention = attention_params(spec, kind) + csa_layer_extra_params(spec, layer)
    else:
        attention = attention_params(spec, kind) + (dsa_indexer_params(spec) if spec.has_dsa_indexer(layer) else 0)
    hc = hyper_connection_params(spec)
    attention += hc if kind is not AttentionKind.NONE else 0
    mlp += hc if spec.has_mlp(layer) else 0
    return LayerParams(attention, mlp, experts, is_moe, kind, replicated)


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One LoRA adapter (Bridge ``ParallelLinearAdapter``, peft/utils.py) on a frozen linear: the
    base's input and output widths; ``column`` for a column-parallel base (its input is a norm
    output, gathered over TP under sequence parallelism); ``expert`` for a routed-expert grouped
    linear, whose local experts share one adapter (``LoRA.share_expert_adapters``, default True)."""

    target: str
    in_features: int
    out_features: int
    column: bool
    expert: bool = False

    def params(self, rank: int) -> int:
        """A·x then B·(A·x): r·(in + out) (linear_in r×in, linear_out out×r)."""
        return rank * (self.in_features + self.out_features)


def lora_adapters(spec: ModelSpec, layer: int, targets: frozenset[str]) -> tuple[LoraAdapter, ...]:
    """The adapters LoRA puts on decoder layer ``layer`` (``spec.mtp_layer`` for an MTP layer):
    Bridge matches ``target_modules`` against module names (peft/lora.py ``LoRA.transform``), so
    GQA/SWA attention offers linear_qkv (h → q(·2 with output gate) + 2·kv) and linear_proj
    (q → h), MLA only linear_proj (n·dv → h), a dense MLP linear_fc1 (h → glu·ffn) and linear_fc2
    (ffn → h), a MoE layer its routed experts' and shared expert's fc1/fc2."""
    kind = attention_kind(spec, layer)
    h, glu = spec.hidden_size, 2 if spec.gated_linear_unit else 1  # fc1 outputs gate and up
    adapters: list[LoraAdapter] = []
    if kind is AttentionKind.MLA:
        if "linear_proj" in targets:
            adapters.append(LoraAdapter("linear_proj", spec.num_attention_heads * spec.v_head_dim, h, column=False))
    elif kind.is_softmax_attention:
        q = spec.num_attention_heads * spec.head_dim
        qkv = q * (2 if spec.attention_output_gate else 1) + 2 * spec.query_groups * spec.head_dim
        if "linear_qkv" in targets:
            adapters.append(LoraAdapter("linear_qkv", h, qkv, column=True))
        if "linear_proj" in targets:
            adapters.append(LoraAdapter("linear_proj", q, h, column=False))
    if spec.is_moe_layer(layer):
        d, f, shared = spec.expert_width, spec.expert_ffn, spec.shared_ffn
        if "linear_fc1" in targets:
            adapters.append(LoraAdapter("linear_fc1", d, glu * f, column=True, expert=True))
            if shared:
                adapters.append(LoraAdapter("linear_fc1", h, glu * shared, column=True))
        if "linear_fc2" in targets:
            adapters.append(LoraAdapter("linear_fc2", f, d, column=False, expert=True))
            if shared:
                adapters.append(LoraAdapter("linear_fc2", shared, h, column=False))
    elif spec.has_mlp(layer):
        ffn = spec.ffn_hidden_size
        if "linear_fc1" in targets:
            adapters.append(LoraAdapter("linear_fc1", h, glu * ffn, column=True))
        if "linear_fc2" in targets:
            adapters.append(LoraAdapter("linear_fc2", ffn, h, column=False))
    return tuple(adapters)


def mtp_extra_params(spec: ModelSpec) -> int:
    """Per MTP layer beyond its transformer layer: enorm h + hnorm h + eh_proj 2h·h + final norm h
    (megatron/core/transformer/multi_token_prediction.py; DeepSeek-V4 splits eh_proj into e_proj and
    h_proj, h·h each, the same count) + its hyper-connection head contraction."""
    h = spec.hidden_size
    return 3 * h + 2 * h * h + hyper_connection_head_params(spec)


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Whole-model parameter counts (unpadded vocabulary, as publishers count)."""

    total: int
    active: int
    embedding: int
    output: int
    routed_experts: int
    mtp: int


def count_params(spec: ModelSpec, *, include_mtp: bool = True, vocab: int | None = None) -> ParamCount:
    """Total and active (all dense + top-k of E routed experts) parameters."""
    v = vocab if vocab is not None else spec.vocab_size
    h = spec.hidden_size
    embedding = v * h
    output = v * h if spec.untie_embeddings_and_output_weights else 0
    dense = routed = active_routed = 0
    per_expert = expert_params(spec)
    for i in range(spec.num_layers):
        lp = layer_params(spec, i)
        dense += lp.dense
        routed += lp.routed_experts
        if lp.is_moe:
            active_routed += spec.moe_router_topk * per_expert
    mtp = 0
    mtp_active = 0
    if include_mtp and spec.mtp_num_layers:
        last = layer_params(spec, spec.mtp_layer)
        per_layer = last.dense + last.routed_experts + mtp_extra_params(spec)
        mtp = spec.mtp_weight_layers * per_layer
        mtp_active = spec.mtp_weight_layers * (
            last.dense + mtp_extra_params(spec) + (spec.moe_router_topk * per_expert if last.is_moe else 0)
        )
    final_norm = h + hyper_connection_head_params(spec)
    total = dense + routed + embedding + output + final_norm + mtp
    active = dense + active_routed + embedding + output + final_norm + mtp_active
    return ParamCount(total, active, embedding, output, routed, mtp)


def active_as_published(spec: ModelSpec, count: ParamCount) -> int:
    """Active parameters under the publisher's convention (which embedding matrices it leaves out)."""
    convention = spec.published.active_convention if spec.published else "all"
    if convention == "no_input_embedding":
        return count.active - count.embedding
    if convention == "no_embeddings":
        return count.active - count.embedding - count.output
    return count.active
