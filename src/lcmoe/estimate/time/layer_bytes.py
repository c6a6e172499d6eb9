"""Coefficient-free bytes one layer moves per microbatch on one GPU, by link: TP, CP (ring and
all-to-all, a mixer's all-to-all), EP dispatch + combine and the permutes (``amounts`` counts
them into its ``LayerAmounts``)."""

from __future__ import annotations

from lcmoe.estimate.memory import BF16, token_shape
from lcmoe.estimate.params import attention_kind
from lcmoe.run import RunConfig
from lcmoe.specs.model import AttentionKind
from lcmoe.workload import TrainingOptions


def mixer_cp_a2a_bytes(run: RunConfig, kind: AttentionKind) -> float:
    """All-to-all bytes per microbatch on one GPU of a GDN or Mamba mixer under CP (sequence ↔
    heads, before and after the mixer, forward and backward): 2·(cp − 1)/cp · tokens · 2 B · width / tp."""
    model, layout = run.model, run.layout
    shape = token_shape(layout, run.options)
    if layout.cp <= 1:
        return 0.0
    if kind is AttentionKind.GDN:
        # GDN CP is Ulysses-style: in_proj output (q, k, v, z, β, α) all-to-all sequence → heads
        # before the conv + recurrence, and the output back, forward and backward, not overlapped
        # (Megatron-LM gdn.py a2a_cp_to_hp / a2a_hp_to_cp; kernel-rates-by-shape.md §4c).
        qk = model.linear_num_key_heads * model.linear_key_head_dim
        vd = model.linear_num_value_heads * model.linear_value_head_dim
        width = 2 * qk + 2 * vd + 2 * model.linear_num_value_heads + vd
        return 2 * (layout.cp - 1) / layout.cp * shape.tokens * BF16 * width / layout.tp
    if kind is AttentionKind.MAMBA:
        # Mamba CP trades sequence for heads: all-to-all of the in_proj output before the
        # conv+scan and of its output after, forward and backward (mamba_context_parallel.py).
        width = model.mamba_in_proj_size + model.mamba_inner_size
        return 2 * (layout.cp - 1) / layout.cp * shape.tokens * BF16 * width / layout.tp
    return 0.0


def attention_cp_bytes(run: RunConfig, layer: int) -> tuple[float, float]:
    """(KV bytes per ring step, all-to-all bytes) of a softmax-attention layer under CP, one GPU,
    one microbatch: ring tokens · 2 B · KV width (/ tp unless DSA); a2a 2·2·(n − 1)/n · tokens ·
    2 B · (2·q width + KV width) / tp (q, k, v in and the output back, forward and backward), n
    the all-to-all group: cp for ``a2a``, the inner size a for ``a2a+p2p``.

    ``a2a+p2p`` (Transformer Engine ``AttnFuncWithCPAndKVP2P`` with two CP groups): the forward
    all-to-alls q, k, v over the a ranks of the inner group (``flash_attn_a2a_communicate`` before
    attention: sequence ↔ heads, so a rank then holds a·tokens rows of heads/(tp·a)), runs the
    p2p ring over the p = cp/a outer ranks, and all-to-alls the output back; the backward
    all-to-alls out and dout, runs the dK/dV ring and all-to-alls dq, dk, dv back. The all-to-all
    bytes are the flat a2a count at group size a (so [cp, 1] costs what ``a2a`` does); a ring
    step moves a·tokens · 2 B · KV width / (tp·a) = the same bytes per step as the flat ring, over
    p − 1 steps instead of cp − 1."""
    model, layout = run.model, run.layout
    kind = attention_kind(model, layer)
    if layout.cp <= 1 or not kind.is_softmax_attention:
        return 0.0, 0.0
    shape = token_shape(layout, run.options)
    if model.is_dsa:
        # DSA all-gathers only the latent keys (and an indexer layer's keys), which every TP
        # rank holds whole (dsa.py gather_from_sequence_parallel_region); the exchange is
        # costed like the ring's, per step of its local share.
        width = model.kv_lora_rank + model.qk_pos_emb_head_dim
        width += model.dsa_indexer_head_dim if model.has_dsa_indexer(layer) else 0
        q_width = 0
    elif model.multi_latent_attention:
        width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
        q_width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim)
    else:
        width = 2 * model.query_groups * model.head_dim
        q_width = model.num_attention_heads * model.head_dim
    cp_kv = shape.tokens * BF16 * width / (1 if model.is_dsa else layout.tp)
    group = layout.cp_a2a_size if layout.cp_comm_type == "a2a+p2p" else layout.cp
    cp_a2a = 2 * 2 * (group - 1) / group * shape.tokens * BF16 * (2 * q_width + width) / layout.tp
    return cp_kv, cp_a2a


def dispatch_bytes(options: TrainingOptions) -> float:
    """Bytes per element of a dispatched token: FP8 (1 B) when DeepEP or HybridEP dispatch under
    an FP8 recipe, else BF16 (2 B); the combine is always BF16."""
    return 1.0 if options.is_fp8 and options.dispatcher in ("deepep", "hybridep") else float(BF16)


def moe_layer_bytes(run: RunConfig, layer: int) -> tuple[float, float]:
    """(EP dispatch + combine bytes, routed-token bytes the permutes move) of a layer, one GPU, one
    microbatch. EP: 2 · Td · width · (dispatch bytes + 2 B), Td = routed tokens · etp · imbalance
    (FP8 dispatch at 1 B with DeepEP / HybridEP); permuted: routed tokens · width · 2 B."""
    model, layout, options = run.model, run.layout, run.options
    if not model.is_moe_layer(layer):
        return 0.0, 0.0
    shape = token_shape(layout, options)
    routed_tokens = shape.tokens / shape.sp * model.moe_router_topk
    moe_token_bytes = routed_tokens * model.expert_width * BF16
    ep_bytes = 0.0
    if layout.ep * layout.etp > 1:
        td = routed_tokens * layout.etp * options.moe_token_imbalance
        ep_bytes = 2 * td * model.expert_width * (dispatch_bytes(options) + BF16)
    return ep_bytes, moe_token_bytes


def tp_layer_bytes(run: RunConfig, layer: int) -> float:
    """Sequence-parallel TP bytes of a layer, one GPU, one microbatch: per block (mixer, MLP) an
    all-gather + reduce-scatter forward and backward, 4 · blocks · (tp − 1)/tp · tokens · h · 2 B."""
    model, layout = run.model, run.layout
    if layout.tp <= 1:
        return 0.0
    shape = token_shape(layout, run.options)
    blocks = (attention_kind(model, layer) is not AttentionKind.NONE) + model.has_mlp(layer)
    return 4 * blocks * (layout.tp - 1) / layout.tp * shape.tokens * model.hidden_size * BF16
