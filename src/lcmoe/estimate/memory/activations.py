"""Stored activations of one layer's blocks for one microbatch, by mixer (GQA/MLA/DSA/GDN/
Mamba) and MLP/MoE."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.memory.constants import BF16, FP32, INT64
from lcmoe.estimate.memory.paged_stash import balanced_dispatched_tokens, expert_bytes_per_token, expert_token_factor
from lcmoe.layout import ParallelLayout
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


@dataclass(frozen=True, slots=True)
class TokenShape:
    """Tokens of one microbatch on one rank: ``tokens`` = s·b/cp, ``sp`` the SP divisor (tp or 1)."""

    tokens: float
    tp: int
    sp: int
    etp: int
    ep: int
    stored_gemm_input: float  # a: 2 in BF16, 1 with FP8, 0 for a frozen LoRA base
    seq_len: int
    mbs: int
    cp: int
    cp_comm_type: str = "p2p"


def token_shape(layout: ParallelLayout, options: TrainingOptions) -> TokenShape:
    return TokenShape(
        tokens=options.seq_len * layout.mbs / layout.cp,
        tp=layout.tp,
        sp=layout.tp if layout.sequence_parallel else 1,
        etp=layout.etp,
        ep=layout.ep,
        # A frozen (LoRA) base keeps no GEMM inputs: TE saves one only for a weight gradient.
        stored_gemm_input=0.0 if options.is_lora else 1.0 if options.is_fp8 else float(BF16),
        seq_len=options.seq_len,
        mbs=layout.mbs,
        cp=layout.cp,
        cp_comm_type=layout.cp_comm_type,
    )


def norm_bytes(shape: TokenShape, h: int, options: TrainingOptions, *, standalone: bool) -> float:
    """A pre-norm block stores the norm input 2·T·h/sp and its output a·T·h/sp (the next GEMM's
    input). Selective ``layernorm`` recompute drops the output only of a standalone norm module:
    Megatron checkpoints a norm only when it is not an IdentityOp (transformer_layer.py,
    TransformerLayer.__init__, ``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm``).
    With the TE layer spec the attention norm of GQA/SWA and Gated DeltaNet blocks and the dense
    MLP's norm are fused into the next GEMM (TELayerNormColumnParallelLinear saves the same two
    tensors) and stay stored; MLA's input norm and the MoE block's pre-MLP norm are standalone
    TENorm modules (gpt_layer_specs.py, ``pre_mlp_layernorm=TENorm if num_experts else
    IdentityOp``; the MLA spec's ``input_layernorm=TENorm``)."""
    stored = BF16 * shape.tokens * h / shape.sp
    if not (standalone and options.recomputes("layernorm")):
        stored += shape.stored_gemm_input * shape.tokens * h / shape.sp
    return stored


def moe_norm_recompute_allowed(options: TrainingOptions) -> bool:
    """Megatron keeps the MoE pre-MLP norm output when the TE CUDA graph captures the router but
    not the alltoall preprocess: the output is then a static graph buffer that cannot be freed
    (transformer_layer.py, ``can_recompute_pre_mlp_layernorm_for_cudagraph``)."""
    scopes = options.cuda_graph_scope
    if "moe_router" not in scopes:
        return True
    return "moe_preprocess" in scopes and options.dispatcher == "alltoall"


def dropout_mask_bytes(shape: TokenShape, h: int, probability: float) -> float:
    """Bias-dropout-add keeps a 1-byte mask of T·h/sp when dropout is on."""
    return shape.tokens * h / shape.sp if probability > 0 else 0.0


def core_attention_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, q_dim: int, v_dim: int
) -> float:
    """Flash/fused attention stores its output 2·T·n·dv/tp and the FP32 log-sum-exp 4·T·n/tp;
    unfused attention also keeps the b·n/tp·s² softmax (2 B), and with attention dropout its
    mask (1 B) and output (2 B). ``core_attn`` recompute keeps none of these."""
    if options.recomputes("core_attn"):
        return 0.0
    n_local = model.num_attention_heads / shape.tp
    stored = BF16 * shape.tokens * v_dim / shape.tp + FP32 * shape.tokens * n_local
    if options.attention_backend == "unfused":  # estimate_memory resolved "auto" already
        per_score = BF16 + (3 if options.attention_dropout > 0 else 0)
        stored += per_score * shape.mbs * n_local * (shape.seq_len / shape.cp) * shape.seq_len / shape.cp
    del q_dim
    return stored


def gqa_attention_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """GQA/MHA/SWA block: norm + QKV output 2·T·(q·(1+gate) + 2·kv)/tp (Q, K, V saved for the
    attention kernel) + qk-norm inputs 2·T·(q+kv)/tp + core attention + projection input
    (FP8 copy a·T·q/tp when FP8) + dropout mask."""
    h = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.query_groups * model.head_dim
    gate = q if model.attention_output_gate else 0
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * shape.tokens * (q + gate + 2 * kv) / shape.tp
    if model.qk_layernorm:
        stored += BF16 * shape.tokens * (q + kv) / shape.tp
    stored += core_attention_bytes(model, shape, options, q, q)
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * q / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def mla_latent_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """What MLA keeps before its up-projections, plain or absorbed (DSA): the standalone input norm
    (``norm_bytes``) and the down-projection outputs with their norms 2·2·T·(rq + rkv + dr)/sp
    (down projections are not split over TP)."""
    rq, rkv, dr = model.q_lora_rank or 0, model.kv_lora_rank, model.qk_pos_emb_head_dim
    stored = norm_bytes(shape, model.hidden_size, options, standalone=True)
    return stored + 2 * BF16 * shape.tokens * (rq + rkv + dr) / shape.sp


def mla_attention_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """MLA block: norm; down-projection outputs and their norms 2·2·T·(rq + rkv + dr) (down
    projections are not split over TP); Q, K, V after the up-projections and RoPE, saved for the
    attention kernel, 2·T·n·(2·(dn+dr) + dv)/tp — the up-projection outputs themselves are not
    saved (the Linear backward needs its input, the cat/RoPE ops save nothing), and
    ``mla_up_proj`` recompute (output-discarding) drops Q, K, V and replays the up-projections;
    core attention; projection input; dropout mask."""
    h, n = model.hidden_size, model.num_attention_heads
    dn, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    stored = mla_latent_bytes(model, shape, options)
    if not options.recomputes("mla_up_proj"):
        stored += BF16 * shape.tokens * n * (2 * (dn + dr) + dv) / shape.tp
    stored += core_attention_bytes(model, shape, options, n * (dn + dr), n * dv)
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * n * dv / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def dsa_attention_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, indexer: bool
) -> float:
    """DSA block: MLA with matrix absorption (experimental_attention_variant/absorbed_mla.py) and a
    sparse core over the top-k keys (dsa.py ``DSAttention``). Per microbatch, T local tokens:

    - the norm and the down-projection outputs with their norms (``mla_latent_bytes``);
    - the query's no-RoPE part 2·T·n·dn/tp (the einsum with W_UK keeps it) and the absorbed query
      2·T·n·(rkv + dr)/tp, and the latent keys 2·S·(rkv + dr), which every TP rank holds whole
      and context parallelism all-gathers (S = T·cp: DSA supports only ``allgather`` CP, so K
      covers the full sequence); ``mla_up_proj`` recompute drops these three;
    - the sparse core's latent output 2·T·n·rkv/tp and FP32 log-sum-exp 4·T·n/tp (``core_attn``
      recompute drops them), and the up-projected output 2·T·n·dv/tp that linear_proj keeps;
    - an indexer layer's top-k indices, 8·T·k (int64, ``torch.topk``), which the layers sharing
      them read; when the indexer trains (loss coefficient > 0) its saved query 2·T·ni·di,
      gathered keys 2·S·di, FP32 head weights 4·T·ni and k-norm input 2·T·di
      (``FusedDSAIndexerLoss.save_for_backward(q, weights, k, …)``); without the loss the indexer
      runs under no_grad and keeps nothing.

    No measured run checks them: Bridge's GLM-5.2 recipes recompute every layer, where they are one
    layer's transient, and the card's peaks fall on the optimizer step and the logits stage
    (memory_points.csv)."""
    h, n = model.hidden_size, model.num_attention_heads
    dn, dr, dv, rkv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, model.kv_lora_rank
    keys = shape.tokens * shape.cp
    stored = mla_latent_bytes(model, shape, options)
    if not options.recomputes("mla_up_proj"):
        stored += BF16 * shape.tokens * n * (dn + rkv + dr) / shape.tp + BF16 * keys * (rkv + dr)
    if not options.recomputes("core_attn"):
        stored += BF16 * shape.tokens * n * rkv / shape.tp + FP32 * shape.tokens * n / shape.tp
    stored += BF16 * shape.tokens * n * dv / shape.tp
    if options.is_fp8:
        stored += shape.stored_gemm_input * shape.tokens * n * dv / shape.tp
    if indexer:
        ni, di = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim
        stored += INT64 * shape.tokens * model.dsa_indexer_topk
        if model.dsa_indexer_loss_coeff > 0:
            stored += BF16 * shape.tokens * (ni * di + di) + BF16 * keys * di + FP32 * shape.tokens * ni
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


# Chunk length of flash-linear-attention's chunked gated delta rule (``chunk_size=64``, the BT
# of its kernels; fla/ops/gated_delta_rule/chunk.py).
GDN_CHUNK = 64


def gdn_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Gated DeltaNet block, what autograd keeps per microbatch (T local tokens; qk = Hk·dk,
    vd = Hv·dv, nv = Hv value heads, every width over tp).

    Under CP, Megatron turns the in_proj output from sequence- to head-parallel with one
    all-to-all (megatron-core 0.19.2 ssm/gated_delta_net/gdn.py:134-166, ``tensor_a2a_cp2hp``):
    each rank then holds the whole sequence S = T·cp for Hv/(tp·cp) heads, the same element
    count as T tokens of Hv/tp heads, and turns the output back with ``tensor_a2a_hp2cp``
    before out_proj (common.py:332-367, 734). So every term below is T-proportional, whatever cp.

    - the norm fused into in_proj (``norm_bytes``);
    - the (all-to-all'd) in_proj output 2·T·(2qk + 2vd + 2nv)/tp: FLA's ``causal_conv1d``
      saves its input x, a view of that buffer, so the whole buffer stays alive
      (fla/modules/conv/triton/ops.py:392 ``save_for_backward(x, weight, …)``, called with
      ``no_guard_contiguous=["x"]``); the conv output itself is not saved;
    - the L2-normalised q, k and their FP32 norms, 2·T·2qk/tp + 4·T·2Hk/tp (fla l2norm.py:266
      ``save_for_backward(y, rstd)``);
    - what the chunk kernel saves (fla/ops/gated_delta_rule/chunk.py:310
      ``save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A, …)``): q and k
      repeated to the Hv value heads 2·T·2·Hv·dk/tp (gdn.py ``repeat_interleave``), v
      2·T·vd/tp, the FP32 cumulative gate 4·T·Hv/tp, beta 2·T·Hv/tp and the inverted
      intra-chunk matrix A, BF16 [T, Hv, 64], 2·T·Hv·64/tp (chunk_fwd.py
      ``solve_tril(..., output_dtype=k.dtype)``); the gate's input alpha 2·T·Hv/tp (the fused
      softplus saves it);
    - the gated output norm: its input (the kernel output) and its output, kept for the product
      with silu(z), and the z gate, 3·2·T·vd/tp (common.py ``_apply_gated_norm``);
    - out_proj's input a·T·vd/tp; dropout mask.

    The chunk states h of [B, S/64, H, dk, dv] are not saved: the backward recomputes them
    (``gdn_chunk_backward_bytes``). Uncertain: ``_prepare_input_for_gated_delta_rule``,
    ``_compute_g_and_beta`` and ``_apply_gated_norm`` run under ``jit_fuser`` (torch.compile),
    whose partitioner may save a different but similar-sized set than eager autograd does."""
    h = model.hidden_size
    hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    qk, vd = hk * dk, hv * dv
    t, tp = shape.tokens, shape.tp
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * t * (2 * qk + 2 * vd + 2 * hv) / tp  # in_proj output (conv input view)
    stored += BF16 * t * 2 * qk / tp + FP32 * t * 2 * hk / tp  # l2-normalised q, k and rstd
    stored += BF16 * t * (2 * hv * dk + vd) / tp  # q, k repeated to Hv heads; v
    stored += (FP32 + 2 * BF16) * t * hv / tp + BF16 * t * hv * GDN_CHUNK / tp  # g, beta, alpha; A
    stored += 3 * BF16 * t * vd / tp  # gated norm input and output, z gate
    stored += shape.stored_gemm_input * t * vd / tp  # out_proj input
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def gdn_chunk_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one Gated DeltaNet layer runs its backward: FLA's
    ``chunk_gated_delta_rule_bwd`` (fla/ops/gated_delta_rule/chunk.py:126-250, commit bc3b101)
    recomputes the WY factors w, u and the chunk states h, then allocates dh, v_new, dv, dq, dk,
    dw, dk2, dv, db, dg, dg2, all alive until it returns. With T tokens of Hv/tp value heads per
    rank (the whole sequence of Hv/(tp·cp) heads under CP, the same count):

        T·Hv/tp · [2·(5·dk + 4·dv) + 2·2·dk·dv/64 + 2·4 + 2]

    (w, dq, dk, dw, dk2: dk wide; u, v_new, dv, dv: dv wide; h and dh in BF16 per 64-token chunk,
    chunk_delta_h.py ``k.new_empty(B, NT, HV, K, V)``; the FP32 gate grads; db). Qwen3-Next
    (Hv 32, dk = dv = 128) at T = 4096: 437 MB. The forward's transients (w, u, h, v_new) are
    a subset. Uncertain to the few tensors FLA versions add or fuse away."""
    hv = model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    per_head_token = BF16 * (5 * dk + 4 * dv) + 2 * BF16 * dk * dv / GDN_CHUNK + 2 * FP32 + BF16
    return shape.tokens * hv / shape.tp * per_head_token


def mamba_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Mamba-2 mixer: fused norm + in_proj input; the z·x·B·C·dt projection 2·T·(2·d_i + 2·G·N
    + nh)/tp and the scan output before its gate 2·T·d_i/tp, both saved by the fused
    conv1d+scan kernel that training runs (mamba_mixer.py ``_ssm_training`` →
    ``mamba_split_conv1d_scan_combined``, which recomputes the conv and states in backward);
    the gated RMSNorm input 2·T·d_i/tp; out_proj input a·T·d_i/tp; dropout mask."""
    h, d_inner = model.hidden_size, model.mamba_inner_size
    stored = norm_bytes(shape, h, options, standalone=False)
    stored += BF16 * shape.tokens * (model.mamba_in_proj_size + 2 * d_inner) / shape.tp
    stored += shape.stored_gemm_input * shape.tokens * d_inner / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def dense_mlp_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, ffn: int, tp: int
) -> float:
    """Dense MLP: norm; FC1 output 2·T·ffn·(2 if GLU)/tp; activation output a·T·ffn/tp; dropout
    mask. ``mlp`` recompute keeps only the MLP input."""
    h = model.hidden_size
    if options.recomputes("mlp"):
        return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)
    stored = norm_bytes(shape, h, options, standalone=False)
    glu = 2 if model.gated_linear_unit else 1
    stored += BF16 * shape.tokens * ffn * glu / tp + shape.stored_gemm_input * shape.tokens * ffn / tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)


def moe_norm_output_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """The MoE block's pre-MLP norm output, as its consumers keep it: the router saves its BF16
    input whatever the precision (moe_utils.py ``RouterGatingLinearFunction``:
    ``save_for_backward(inp, …)``), 2·T·h/sp, and a shared expert's FC1 saves the same tensor in
    BF16 or its own quantized copy a·T·h/sp under FP8 (none when frozen). Selective
    ``layernorm`` recompute of this standalone norm discards the output, and with it what the
    router kept (``moe_norm_recompute_allowed``; under FP8 Megatron makes the shared expert save
    the original input, transformer_layer.py ``set_for_recompute_pre_mlp_layernorm``)."""
    if options.recomputes("layernorm") and moe_norm_recompute_allowed(options):
        return 0.0
    stored = BF16 * shape.tokens * model.hidden_size / shape.sp
    if options.is_fp8 and model.shared_ffn:
        stored += shape.stored_gemm_input * shape.tokens * model.hidden_size / shape.sp
    return stored


def dispatched_tokens(model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, stored: bool = True) -> float:
    """Tokens one GPU's local experts process: T/sp local tokens × top-k, gathered over ETP, times
    what the expert tensors are sized for (``paged_stash.expert_token_factor``: the load
    imbalance, 1 under forced balance; a static budget with a rank capacity factor or a
    full-iteration graph; the paged stash's pages for what backward keeps, ``stored``)."""
    balanced = balanced_dispatched_tokens(model, shape.tokens, shape.sp, shape.etp)
    return balanced * expert_token_factor(options, stored=stored)


def moe_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """MoE block: norm input 2·T·h/sp and its output as the router and shared expert keep it
    (``moe_norm_output_bytes``); router logits and probabilities 2·4·(T/sp)·E (FP32 router); per dispatched
    token Td: expert FC1 input a·Td·d_e, FC1 output 2·Td·f·(2 if GLU)/etp, activation output
    a·Td·f/etp (dropped by ``moe_act``); shared expert as a dense MLP; LatentMoE's up-projection
    input a·(T/sp)·d_l (its down-projection reads the norm output, already stored); dropout
    mask. d_e is the width routed tokens carry (h, or the latent size). The router
    probabilities are applied inside the expert activation (experts.py
    ``activation_func_with_probs``), so unpermute saves no Td·d_e copy. ``moe`` recompute keeps
    only the block input."""
    h = model.hidden_size
    if options.recomputes("moe"):
        return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)
    experts = model.num_moe_experts or 0
    stored = BF16 * shape.tokens * h / shape.sp + moe_norm_output_bytes(model, shape, options)
    router_bytes = FP32 if options.moe_router_dtype_fp32 else BF16
    stored += 2 * router_bytes * shape.tokens / shape.sp * experts
    td = dispatched_tokens(model, shape, options)
    stored += td * expert_bytes_per_token(model, shape.stored_gemm_input, shape.etp, options)
    glu = 2 if model.gated_linear_unit else 1
    if model.moe_latent_size:
        stored += shape.stored_gemm_input * shape.tokens / shape.sp * model.moe_latent_size
    if model.shared_ffn and not options.recomputes("shared_experts"):
        stored += BF16 * shape.tokens * model.shared_ffn * glu / shape.tp
        stored += shape.stored_gemm_input * shape.tokens * model.shared_ffn / shape.tp
    return stored + dropout_mask_bytes(shape, h, options.hidden_dropout)
