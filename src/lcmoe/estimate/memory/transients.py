"""Working sets live only for a moment: logits/loss, MoE dispatch, mixer backward scratch, CP
buffers, TE workspaces, CUDA-graph pools, dispatcher buffers."""

from __future__ import annotations

from collections.abc import Callable

from lcmoe.estimate.memory.activations import (
    TokenShape,
    dispatched_tokens,
    gdn_chunk_backward_bytes,
)
from lcmoe.estimate.memory.constants import (
    BF16,
    DEEPEP_BUFFER_BYTES,
    DEEPEP_NVL_PEERS,
    DEFAULT_NVLINK_DOMAIN,
    FP32,
    GIB,
    HYBRIDEP_SCALE_BLOCK,
    INT32,
    TE_CUBLAS_WORKSPACE_BYTES,
    TE_CUBLAS_WORKSPACE_BYTES_PRE_HOPPER,
    TE_GROUPED_GEMM_STREAMS,
)
from lcmoe.estimate.params import (
    attention_kind,
)
from lcmoe.layout import PipelineStage
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions, unchecked_replace


def logits_loss_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions, heads: int) -> float:
    """Loss stage, per microbatch: final norm 2·2·T·h/sp, plus (4·H + 2)·T·V/tp for H output heads
    (the main head and each MTP depth, computed one after the other, each keeping what its
    backward needs). Megatron's unfused and fused kernels cast each head's BF16 logits to FP32
    (``logits.float()``), turn that buffer into the softmax in place and save it for backward
    (tensor_parallel/cross_entropy.py ``calculate_logits_max``; fusions/fused_cross_entropy.py
    ``save_for_backward(exp_logits, …)``; torch.compile keeps those steps in place, the saved
    softmax being the cast buffer itself: tests/test_megatron_validation.py): 4 B per head, plus
    the current head's 2 B BF16 logits while it is cast (and its 2 B BF16 gradient in backward).
    With one head that is the 6 B every golden run shows. Transformer Engine's kernel
    (``cross_entropy_fusion_impl=te``, Bridge's perf-recipe default) saves only the BF16 logits in
    its source (transformer_engine/pytorch/cross_entropy.py ``save_for_backward(_input)``), yet the five
    measured Nemotron-3.5 Lightning runs that use it (three heads, memory_points.csv) peak within
    2% of where 4 B per head puts them and 2 B per head would leave them 9–14% short, so every
    kernel is modelled at 4·H + 2."""
    vocab = model.padded_vocab_size(shape.tp)
    per_token_vocab = FP32 * heads + BF16
    norm = 2 * BF16 * shape.tokens * model.hidden_size / shape.sp
    return norm + per_token_vocab * shape.tokens * vocab / shape.tp


def moe_dispatch_transient_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """Live only while one MoE layer runs: the permuted send buffer and the received tokens,
    2·2·Td·d_e (alltoall/flex); the allgather dispatcher gathers every TP·EP rank's tokens,
    2·(T/sp)·tp·ep·d_e, before selecting its own (d_e: ``ModelSpec.expert_width``)."""
    if not model.is_moe:
        return 0.0
    d_e = model.expert_width
    td = dispatched_tokens(model, shape, options, stored=False)
    if options.dispatcher == "allgather":
        return BF16 * shape.tokens / shape.sp * shape.tp * shape.ep * d_e + 2 * BF16 * td * d_e
    return 2 * BF16 * td * d_e


# Megatron's cuDNN DSA path bounds its scratch (experimental_attention_variant/dsa_cudnn_kernels.py
# _INDEXER_SCORE_CHUNK_MAX_BYTES, _TOPK_WRAPPER_MAX_SCRATCH_BYTES).
DSA_SCORE_CHUNK_BYTES = GIB
DSA_TOPK_SCRATCH_BYTES = 2 * GIB


def dsa_kernel_scratch_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while an indexer layer runs (Bridge's GLM-5.2 recipes pick the cuDNN DSA
    kernels, ``dsa_kernel_backend="cudnn"``): the FP32 index scores of a chunk of query rows over
    every key, min(4·T·S, 1 GiB), and the top-k wrapper's two int32 words per score, min(8·T·S,
    2 GiB) (dsa_cudnn_kernels.py ``_indexer_score_chunk_rows``, ``_indexer_top_k_wrapper_chunked``);
    T local queries, S = T·cp all-gathered keys. GLM-5.2 at 200K over CP 32: 1 + 2 GiB."""
    if not model.is_dsa:
        return 0.0
    pairs = shape.tokens * shape.tokens * shape.cp
    return min(FP32 * pairs, DSA_SCORE_CHUNK_BYTES) + min(2 * INT32 * pairs, DSA_TOPK_SCRATCH_BYTES)


# FlashMLA's sparse kernels run 64 query heads at least (dsa_cudnn_kernels.py
# ``_flash_mla_head_padding``: fewer local heads are zero-padded to 64 on Hopper).
FLASH_MLA_MIN_HEADS = 64


def dsa_sparse_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one DSA layer's sparse attention runs its backward (every DSA layer,
    index-sharing ones too): megatron-core 0.19.2 experimental_attention_variant/
    dsa_cudnn_kernels.py ``FusedSparseAttentionFunc.backward`` → ``_run_sparse_attention_backward``
    (:1996-2097), the cuDNN path Bridge's GLM-5.2 recipes select (``dsa_kernel_backend="cudnn"``).
    It appends a zero row to the absorbed query, the latent output, its gradient, the LSE and
    the top-k indices (``torch.cat``, :2070-2075), gathers the rows that have keys
    (``index_select(...).contiguous()``, :2077-2089), runs the kernel, which returns dq and the
    gradient of the gathered latent keys, and scatters dq into a zeroed full-size tensor
    (:2091). With T local queries, n' = max(n/tp, 64) heads as the kernel pads them, d_q = rkv + dr,
    d_v = rkv, k top-k and S = T·cp all-gathered keys:

        2·(2·T·n'·(d_q + 2·d_v) + 4·T·n' + 4·T·k)    two copies of q, out, dO, LSE, indices
      + 2·2·T·n'·d_q                                  dq and its scattered copy
      + 4·S·d_q                                       dkv over every gathered key

    GLM-5.2 at 200K over CP 32 (T = 6250, 64 heads): 3.8 GiB. Uncertain: the dtype of the
    kernel's dkv (taken as FP32 accumulation) and whether cuDNN allocates its own workspace."""
    if not model.is_dsa:
        return 0.0
    t, keys = shape.tokens, shape.tokens * shape.cp
    heads = max(model.num_attention_heads / shape.tp, FLASH_MLA_MIN_HEADS)
    d_q = model.kv_lora_rank + model.qk_pos_emb_head_dim
    d_v = model.kv_lora_rank
    copies = 2 * (BF16 * t * heads * (d_q + 2 * d_v) + FP32 * t * heads + INT32 * t * model.dsa_indexer_topk)
    return copies + 2 * BF16 * t * heads * d_q + FP32 * keys * d_q


def mamba_scan_backward_bytes(model: ModelSpec, shape: TokenShape) -> float:
    """Live only while one Mamba-2 mixer runs its backward: the fused kernel Megatron trains
    with (megatron-core 0.19.2 ssm/mamba_mixer.py:727-781 ``mamba_split_conv1d_scan_combined``)
    saves only its input and the scan output, and its backward (state-spaces/mamba@e9594ce
    mamba_ssm/ops/triton/ssd_combined.py:903-990 ``MambaSplitConv1dScanCombinedFn.backward``,
    :397-470 ``_mamba_chunk_scan_combined_bwd``) rebuilds the conv output x·B·C, allocates the
    in_proj-wide gradient dzxbcdt and dxBC, recomputes CB and the chunk states in FP32, and
    makes the state gradients, both cast to the BF16 state dtype (Megatron's default
    ``mamba_training_ssm_states_dtype`` = params dtype). With T local tokens (Megatron's Mamba CP
    is an all-to-all to head-parallel, mamba_context_parallel.py, so T·cp tokens of 1/cp of the
    heads), d_i, G, nh over tp, N the state size and cs the chunk length:

        (4 + 4 + 2 + 2)·T·d_i·N/cs        states and dstates, FP32 and BF16
      + 4·T·G·cs                          CB
      + 2·2·T·(d_i + 2·G·N)               recomputed x·B·C and its gradient
      + 2·T·(2·d_i + 2·G·N + nh)          dzxbcdt
      + 2·T·d_i + 3·4·T·nh                the output-gradient copy; dA_cumsum, dt, ddA (FP32)

    Nemotron-3 Nano (64 heads of 64, N 128, 8 groups, chunk 128) at T = 8192: 0.8 GiB.
    Uncertain to the few [T, nh]-sized FP32 buffers the Triton kernels add."""
    if not model.mamba_num_heads:
        return 0.0
    tp, t = shape.tp, shape.tokens
    d_i = model.mamba_inner_size / tp
    groups, state, heads = model.mamba_num_groups / tp, model.mamba_state_dim, model.mamba_num_heads / tp
    chunk = model.mamba_chunk_size
    xbc = d_i + 2 * groups * state
    scratch = (2 * FP32 + 2 * BF16) * t * d_i * state / chunk + FP32 * t * groups * chunk
    scratch += 2 * BF16 * t * xbc + BF16 * t * (d_i + xbc + heads) + BF16 * t * d_i + 3 * FP32 * t * heads
    return scratch


def cp_p2p_attention_forward_bytes(model: ModelSpec, layer: int, shape: TokenShape) -> float:
    """Live only while one softmax-attention layer (GQA, sliding window, plain MLA) runs its
    forward under ring (``p2p``) context parallelism: Transformer Engine's
    ``AttnFuncWithCPAndKVP2P.forward`` allocates a new K/V receive buffer at every one of the cp
    steps (``p2p_comm_buffers[i + 1] = torch.empty_like(p2p_comm_buffers[i])``) and keeps every
    step's output and LSE (``out_per_step``, ``softmax_lse_per_step``) for the output correction
    after the loop; none is released before the function returns
    (TransformerEngine@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py:1672-1717, 1979-2087). On the last CP rank of the causal load-balanced
    split every step computes all T local query rows, so with S = T·cp, n = heads/tp,
    n_kv = K/V heads/tp (MLA: n), dk, dv the K and V head widths:

        2·S·n_kv·(dk + dv) + 2·S·n·dv + 4·S·n + 4·T·n·dv

    (K/V ring buffers, per-step outputs and LSEs, the FP32 corrected output). The backward keeps
    two ping-pong K/V(+dK/dV) buffers only, so this is a forward moment. ``a2a`` CP trades
    heads for sequence (T·cp tokens of n/cp heads) and DSA all-gathers latent keys instead
    (``dsa_sparse_backward_bytes``), so neither has it. ``a2a+p2p`` [a, p] runs the same loop over
    its p outer ranks on a·T rows of n/a heads (after its all-to-all, which keeps the element
    count), so S = T·p in the formula; it is left at 0 here with the rest of this term. Not
    applied to the estimate (``stage_mixer_transients``):
    the DeepSeek-V3 long-context layouts NVIDIA ran at CP 16-64 would then be predicted out of
    memory by 5-15%, so either this or another term of those estimates is off, and no measured
    long-context peak tells which."""
    kind = attention_kind(model, layer)
    if shape.cp <= 1 or shape.cp_comm_type != "p2p" or not kind.is_softmax_attention or model.is_dsa:
        return 0.0
    n = model.num_attention_heads / shape.tp
    if kind is AttentionKind.MLA:
        n_kv, dk, dv = n, model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    else:
        n_kv, dk, dv = model.query_groups / shape.tp, model.head_dim, model.head_dim
    t, s = shape.tokens, shape.tokens * shape.cp
    return BF16 * s * n_kv * (dk + dv) + BF16 * s * n * dv + FP32 * s * n + FP32 * t * n * dv


def stage_mixer_transients(
    model: ModelSpec, stage: PipelineStage, shape: TokenShape, options: TrainingOptions
) -> tuple[float, float]:
    """(forward, backward) working sets of the stage's sequence mixers beyond their stored
    tensors, the largest over the stage's layer kinds: the DSA indexer's score and top-k
    scratch (``dsa_kernel_scratch_bytes``, in the forward, replayed in the backward under
    recompute), the DSA sparse-attention backward (``dsa_sparse_backward_bytes``), the
    Gated DeltaNet chunk backward (``gdn_chunk_backward_bytes``) and the Mamba-2 scan backward
    (``mamba_scan_backward_bytes``). The TE ring-CP forward
    (``cp_p2p_attention_forward_bytes``) is left out until a measurement settles it."""
    del options
    if not (model.is_dsa or model.linear_attention_type or model.mamba_num_heads):
        return 0.0, 0.0  # the planner's hot path: most models hold none of these mixers
    firsts = [first for first, count in stage.layer_groups if count]
    if stage.mtp_layers:
        firsts.append(model.mtp_layer)
    kinds = {attention_kind(model, layer) for layer in firsts}
    forward = backward = 0.0
    if model.is_dsa and AttentionKind.MLA in kinds:
        if any(model.has_dsa_indexer(layer) for layer in firsts):
            forward = dsa_kernel_scratch_bytes(model, shape)
        backward = dsa_sparse_backward_bytes(model, shape)
    if AttentionKind.GDN in kinds:
        backward = max(backward, gdn_chunk_backward_bytes(model, shape))
    if AttentionKind.MAMBA in kinds:
        backward = max(backward, mamba_scan_backward_bytes(model, shape))
    return forward, backward


def te_workspace_bytes(model: ModelSpec, options: TrainingOptions, architecture: str) -> float:
    """cuBLAS(Lt) workspaces Transformer Engine allocates through PyTorch: one of 32 MiB on
    Hopper and later (4 MiB before), plus four more for the multi-stream grouped GEMM of MoE
    experts (transformer_engine/pytorch/module/base.py ``get_workspace``,
    ``get_multi_stream_cublas_workspace``)."""
    per_stream = (
        TE_CUBLAS_WORKSPACE_BYTES if architecture in ("hopper", "blackwell") else TE_CUBLAS_WORKSPACE_BYTES_PRE_HOPPER
    )
    streams = 1 + (TE_GROUPED_GEMM_STREAMS if model.is_moe and options.moe_grouped_gemm else 0)
    return per_stream * streams


def replayed_options(options: TrainingOptions) -> TrainingOptions:
    """The options a layer's backward runs under: selectively recomputed modules are
    rematerialised for it (the checkpoint replays their forward), so its working set is the
    layer without selective recompute (``estimate_memory`` builds them once for its stages)."""
    if options.recompute_granularity != "selective":
        return options
    # "none" with no modules is valid for any validated options, so no re-validation.
    return unchecked_replace(options, recompute_granularity="none", recompute_modules=frozenset())


def stage_holds(model: ModelSpec, stage: PipelineStage, holds: Callable[[int], bool]) -> bool:
    """Whether a decoder or MTP layer of the stage satisfies ``holds``, a property of the layer
    signature (MoE, DSA indexer): one layer per signature group is asked."""
    return any(holds(first) for first, _ in stage.layer_groups) or bool(stage.mtp_layers and holds(model.mtp_layer))


def cuda_graph_pool_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, stage: PipelineStage, inflight: int
) -> float:
    """CUDA-graph memory the caching allocator cannot share with eager tensors (allocated).

    TE-scoped graphs (``cuda_graph_impl=transformer_engine``): Megatron gives each (layer,
    microbatch) graph a static input that is reused once that microbatch's backward is done,
    and from TE 2.7 make_graphed_callables also reuses the static input/output buffers between
    graphs, one graph's output being the next one's input (megatron/core/transformer/
    cuda_graphs.py:2322-2345 ``_get_sample_arguments``, :2684-2686
    ``_reuse_graph_input_output_buffers``). Those inputs are the block inputs autograd saves
    anyway (``norm_bytes``), and what a graph saves for backward lives in the shared graph pool
    in place of the eager copy, so what is left is one input and one output buffer of 2·T·h/sp
    per in-flight microbatch while a graph chain runs: 2·(2·T·h/sp)·inflight, when the stage
    holds a graphed module. Measured runs are consistent with that: Nemotron-3.5 Lightning on
    8 GB200 at MBS 2 peaks at 156.85 GiB allocated with attn, mamba, moe_router and
    moe_preprocess graphed (perf recipe) and at 158.22 GiB without graphs (convergence recipe,
    natural routing), where one buffer pair per graphed module and layer would add 13 GiB
    (memory_points.csv).

    A full-iteration graph captures forward and backward of every microbatch into one private
    pool that is reused during capture as the eager allocator would be (torch.cuda.graph empties
    the eager cache before capture; Bridge sets ``graph_capture_record_stream_reuse:True`` so
    side-stream frees are reused too), so it adds no term here: its cost is the static MoE token
    budget (``dispatched_tokens``) and its working set staying pinned through the optimizer
    step (``stage_memory``).
    """
    scope = options.cuda_graph_scope
    if not scope or "full_iteration" in scope:
        return 0.0
    groups = [*stage.layer_groups, (model.mtp_layer, stage.mtp_layers)]
    if not any(count and graphed_modules(model, first, scope) for first, count in groups):
        return 0.0
    return 2 * BF16 * shape.tokens * model.hidden_size / shape.sp * inflight


def graphed_modules(model: ModelSpec, layer: int, scope: frozenset[str]) -> int:
    """How many of the scope's modules a layer holds: ``attn`` any attention, ``mamba`` a Mamba
    mixer, ``mlp`` a dense MLP, ``moe`` / ``moe_router`` / ``moe_preprocess`` a MoE block
    (transformer_config.py cuda_graph_scope; a hybrid model's layer holds one block)."""
    kind = attention_kind(model, layer)
    holds = {
        "attn": kind not in (AttentionKind.MAMBA, AttentionKind.NONE),
        "mamba": kind is AttentionKind.MAMBA,
        "mlp": model.has_mlp(layer) and not model.is_moe_layer(layer),
    }
    moe = model.is_moe_layer(layer)
    return sum(holds.get(name, moe) for name in scope)


def dispatcher_buffer_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, nvlink_domain: int = DEFAULT_NVLINK_DOMAIN
) -> float:
    """DeepEP / HybridEP register their NVLink (and RDMA) buffers with cudaMalloc / cuMem outside
    the PyTorch allocator, so they appear in reserved (nvidia-smi) memory only. DeepEP: ≈1 GiB
    NVL buffer, plus ≈1 GiB RDMA buffer when the EP group leaves the NVLink domain (DeepEP
    defaults; facts §6.13). HybridEP: ``hybridep_buffer_bytes``."""
    if not model.is_moe or options.dispatcher not in ("deepep", "hybridep"):
        return 0.0
    if options.dispatcher == "hybridep":
        return hybridep_buffer_bytes(model, shape, nvlink_domain=nvlink_domain)
    return DEEPEP_BUFFER_BYTES * (2.0 if shape.ep * shape.etp > DEEPEP_NVL_PEERS else 1.0)


def hybridep_buffer_bytes(model: ModelSpec, shape: TokenShape, *, nvlink_domain: int = DEFAULT_NVLINK_DOMAIN) -> float:
    """HybridEP's buffers, sized once for the worst case of every token of the EP group landing on
    one rank (DeepEP hybrid-ep ``HybridEPBuffer::allocate_buffer``; csrc/hybrid_ep/hybrid_ep.cu,
    buffer/intranode.cu ``allocate_dispatch_buffers`` / ``allocate_combine_buffers``).

    Tᵣ = tokens one rank dispatches (Megatron passes the first input's row count, T/sp:
    fused_a2a.py ``init_hybrid_ep_buffer``); the group of g = ep·etp ranks spans R = min(D, g)
    ranks per NVLink domain of D GPUs and N = g/R domains (deep_ep/hybrid_ep_buffer.py reads D
    from ``NVLINK_DOMAIN_SIZE``, which Bridge sets to the system's domain: 8 on HGX, 72 on
    NVL72); Eᵣ local experts; d the dispatched width. M = Tᵣ·R·N tokens:

        M·(2·d + 4·R·Eᵣ + 4·d/128)     BF16 tokens (Megatron never dispatches FP8,
                                        fused_a2a.py), FP32 probabilities, FP32 scales

    shared by dispatch and combine inside one domain; across domains dispatch keeps its own
    token and probability buffers, and three RDMA staging buffers of Tᵣ·(N − 1) tokens are
    added. Example: DeepSeek-V3 at 4K tokens per rank, EP64 on NVL72: M = 4096·64 = 262 144,
    262 144·(2·7168 + 4·256 + 224) B = 3.8 GiB; Qwen3-30B-A3B at MBS 4, EP8: 0.6 GiB."""
    group = shape.ep * shape.etp
    ranks = min(nvlink_domain, group)
    domains = max(group // ranks, 1)
    local_experts = (model.num_moe_experts or 0) / shape.ep
    width = model.expert_width
    tokens = shape.tokens / shape.sp
    per_token = BF16 * width + FP32 * ranks * local_experts
    worst = tokens * ranks * domains
    buffers = worst * (per_token + FP32 * width / HYBRIDEP_SCALE_BLOCK)
    if domains > 1:
        buffers += worst * per_token + 3 * tokens * (domains - 1) * per_token
    return buffers
