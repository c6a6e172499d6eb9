"""Stored activations of whole layers and chunks: layer assembly, LoRA adapters, offloading,
MTP, full recompute, embedding."""

from __future__ import annotations

from lcmoe.estimate.memory.activations import (
    TokenShape,
    core_attention_bytes,
    dense_mlp_activation_bytes,
    dispatched_tokens,
    dropout_mask_bytes,
    dsa_attention_activation_bytes,
    gdn_activation_bytes,
    gqa_attention_activation_bytes,
    mamba_activation_bytes,
    mla_attention_activation_bytes,
    moe_activation_bytes,
)
from lcmoe.estimate.memory.constants import (
    BF16,
)
from lcmoe.estimate.params import (
    LayerSignature,
    attention_kind,
    layer_signature,
    lora_adapters,
)
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions


def layer_activation_bytes(
    model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions, *, moe_scale: float = 1.0
) -> float:
    """Stored activations of one transformer layer for one microbatch (no full recompute);
    ``moe_scale`` is the fitted multiplier on the MoE block's tensors."""
    kind = attention_kind(model, layer)
    if kind is AttentionKind.MLA and model.is_dsa:
        attn = dsa_attention_activation_bytes(model, shape, options, indexer=model.has_dsa_indexer(layer))
    elif kind is AttentionKind.MLA:
        attn = mla_attention_activation_bytes(model, shape, options)
    elif kind is AttentionKind.GDN:
        attn = gdn_activation_bytes(model, shape, options)
    elif kind is AttentionKind.MAMBA:
        attn = mamba_activation_bytes(model, shape, options)
    elif kind is AttentionKind.NONE:
        attn = 0.0
    else:
        attn = gqa_attention_activation_bytes(model, shape, options)
    if model.is_moe_layer(layer):
        mlp = moe_scale * moe_activation_bytes(model, shape, options)
    elif model.has_mlp(layer):
        mlp = dense_mlp_activation_bytes(model, shape, options, model.ffn_hidden_size, shape.tp)
    else:
        mlp = 0.0
    if options.is_lora:
        mlp += lora_activation_bytes(model, layer, shape, options)
    offloaded = activation_offload_saving(model, layer, shape, options)
    return max(attn + mlp - offloaded, 0.0)


def lora_activation_bytes(model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions) -> float:
    """What a LoRA layer stores besides the frozen base (whose linears keep no inputs:
    ``token_shape``; Transformer Engine saves a GEMM input only when ``backward_needs_input =
    is_grad_enabled and weight.requires_grad``, module/linear.py, layernorm_linear.py). Each
    adapter's LoRA-A is a Megatron linear that saves its BF16 input for its weight gradient, and
    LoRA-B saves the rank-r LoRA-A output, 2·T·r (2·Td·r for experts):
    - linear_qkv / a dense or shared linear_fc1: the norm output, gathered over TP under sequence
      parallelism, 2·T·h (2·T·h/sp with ``lora_input_regather``, which gathers it again in
      backward; Bridge peft/utils.py ``ParallelLinearAdapter.forward``); a routed expert's fc1
      the dispatched tokens 2·Td·d_e;
    - linear_proj: the attention output 2·T·q/tp, the tensor the attention kernel saves anyway,
      unless core_attn is recomputed or an output gate makes a new one;
    - linear_fc2: the activation output 2·T·ffn/tp (experts 2·Td·f/etp; a ``moe_act`` checkpoint
      frees its storage).
    A shared expert's fc1 adapter saves the norm output the router keeps anyway
    (``moe_norm_output_bytes``) unless it gathers it over TP. Adapters inside a recomputed
    ``mlp``, ``moe`` or ``shared_experts`` block keep nothing."""
    r = options.lora_rank
    t = shape.tokens
    is_moe = model.is_moe_layer(layer)
    td = dispatched_tokens(model, shape, options) if is_moe else 0.0
    gathered = shape.sp if options.lora_input_regather else 1
    stored = 0.0
    for adapter in lora_adapters(model, layer, options.lora_targets):
        if adapter.expert:
            if options.recomputes("moe"):
                continue
            stored += BF16 * td * r
            if adapter.column:
                stored += BF16 * td * adapter.in_features
            elif not options.recomputes("moe_act"):
                stored += BF16 * td * adapter.in_features / shape.etp
            continue
        in_mlp = adapter.target in ("linear_fc1", "linear_fc2")
        if in_mlp and (
            options.recomputes("mlp" if not is_moe else "moe") or (is_moe and options.recomputes("shared_experts"))
        ):
            continue
        stored += BF16 * t * r
        if adapter.target == "linear_proj":
            if options.recomputes("core_attn") or model.attention_output_gate:
                stored += BF16 * t * adapter.in_features / shape.tp
        elif adapter.column:
            # Only the shared expert's fc1 reads the MoE norm output; linear_qkv reads the
            # attention norm's, which nothing else keeps.
            shares_router_input = is_moe and adapter.target == "linear_fc1" and shape.sp == gathered
            if not shares_router_input:
                stored += BF16 * t * adapter.in_features / gathered
        else:
            stored += BF16 * t * adapter.in_features / shape.tp
    return stored


def activation_offload_saving(model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions) -> float:
    """Fine-grained activation offloading (``--offload-modules``) moves a module's saved inputs
    to the host: attn_norm / mlp_norm the norm inputs 2·T·h/sp (standalone norms only: MLA's
    input norm, the MoE pre-MLP norm); qkv_linear the QKV input a·T·h/sp (gone when a
    standalone norm's output is recomputed); core_attn everything core attention saves (Q, K, V,
    output); attn_proj the projection input; expert_fc1 the expert FC1 input a·Td·d_e; moe_act
    the activation output. Scaled by ``activation_offload_fraction``: Megatron keeps the last
    (1 − f) of each chunk's eligible groups on the GPU (pipeline_parallel/
    fine_grained_activation_offload.py:608-624), for a chunk of like layers f of the bytes."""
    mods = options.activation_offload_modules
    if not mods:
        return 0.0
    return options.activation_offload_fraction * _offloadable_bytes(model, layer, shape, options, mods)


def offload_inflight_bytes(
    model: ModelSpec, groups: tuple[tuple[int, int], ...], shape: TokenShape, options: TrainingOptions, copies: float
) -> float:
    """What fine-grained offloading keeps on the GPU at the peak: the largest layer's offloaded
    bytes (``activation_offload_saving``), at most all that the stage offloads (``groups``:
    (layer, count) of its layers; ``copies``: microbatch copies of them in flight). The last group
    of each module name before backward is never offloaded (the offload margin, pipeline_parallel/
    fine_grained_activation_offload.py:582-595; should_bulk_offload :1066-1086), so the first
    backward does not wait on a reload; later reloads replace what each backward frees.
    Measured: Megatron-LM's four fine-grained-offloading golden runs (megatron_golden.csv,
    gpt3_moe_..._fine_grained_offloading, H100 and GB200) are then predicted +5.1% and +2.4%
    (-1.0% holding nothing, +15% holding two layers), the golden set's p90 error unchanged (7.7%)."""
    if not options.activation_offload_modules:
        return 0.0
    saved = [(activation_offload_saving(model, layer, shape, options), count) for layer, count in groups]
    largest = max((bytes_ for bytes_, _ in saved), default=0.0)
    return min(largest, copies * sum(bytes_ * count for bytes_, count in saved))


def offload_host_bytes(
    model: ModelSpec, groups: tuple[tuple[int, int], ...], shape: TokenShape, options: TrainingOptions, copies: float
) -> float:
    """Pinned host memory the offloaded activations take at the GPU's peak: ``copies`` × every
    layer's ``activation_offload_saving`` less what ``offload_inflight_bytes`` keeps on the GPU
    (Megatron's CPU tensor pool, fine_grained_activation_offload.py:132-226)."""
    if not options.activation_offload_modules:
        return 0.0
    total = copies * sum(count * activation_offload_saving(model, layer, shape, options) for layer, count in groups)
    return total - offload_inflight_bytes(model, groups, shape, options, copies)


def _offloadable_bytes(
    model: ModelSpec, layer: int, shape: TokenShape, options: TrainingOptions, mods: frozenset[str]
) -> float:
    """The bytes ``mods`` move off the GPU for one layer and microbatch (before the fraction)."""
    h = model.hidden_size
    saving = 0.0
    kind = attention_kind(model, layer)
    standalone_attn_norm = kind is AttentionKind.MLA
    has_attention = kind.is_softmax_attention
    # Megatron offloads only standalone norms (transformer_layer.py ``offload_attn_norm`` /
    # ``offload_mlp_norm`` require a norm that is not an IdentityOp; see norm_bytes).
    if "attn_norm" in mods and standalone_attn_norm:
        saving += BF16 * shape.tokens * h / shape.sp
    if "mlp_norm" in mods and model.is_moe_layer(layer):
        saving += BF16 * shape.tokens * h / shape.sp
    if "qkv_linear" in mods and has_attention and not (standalone_attn_norm and options.recomputes("layernorm")):
        saving += shape.stored_gemm_input * shape.tokens * h / shape.sp
    if "core_attn" in mods and has_attention:
        q = model.num_attention_heads * model.head_dim
        kv = model.query_groups * model.head_dim
        saving += BF16 * shape.tokens * (q + 2 * kv) / shape.tp
        saving += core_attention_bytes(model, shape, options, q, q)
    if "attn_proj" in mods and options.is_fp8 and has_attention:
        saving += shape.stored_gemm_input * shape.tokens * model.num_attention_heads * model.head_dim / shape.tp
    if model.is_moe_layer(layer) and not options.recomputes("moe"):
        td = dispatched_tokens(model, shape, options)
        if "expert_fc1" in mods:
            saving += shape.stored_gemm_input * td * model.expert_width
        if "moe_act" in mods and not options.recomputes("moe_act"):
            saving += shape.stored_gemm_input * td * model.expert_ffn / shape.etp
    return saving


def mtp_layer_activation_bytes(
    model: ModelSpec, shape: TokenShape, options: TrainingOptions, *, moe_scale: float = 1.0
) -> float:
    """An MTP layer: its transformer layer (the last decoder layer's kind, or a hybrid model's
    MTP depth) plus 5·2·T·h/sp: the inputs of the embedding and hidden-state norms (2·T·h/sp
    each), the concatenated 2h input the eh_proj linear saves, and the depth's final norm input
    (multi_token_prediction.py ``_concat_embeddings``, ``_postprocess``)."""
    h = model.hidden_size
    return (
        layer_activation_bytes(model, model.mtp_layer, shape, options, moe_scale=moe_scale)
        + 5 * BF16 * shape.tokens * h / shape.sp
    )


def chunk_layer_bytes(
    model: ModelSpec,
    layers: tuple[int, ...],
    mtp: int,
    shape: TokenShape,
    options: TrainingOptions,
    *,
    moe_scale: float = 1.0,
    known: dict[LayerSignature, float] | None = None,
) -> list[float]:
    """Per-layer stored activations of one model chunk for one microbatch (MTP layers last).
    Identical layers (same signature) are computed once; ``known`` carries them across the chunks
    and stages of one estimate (same model, shape, options and ``moe_scale``)."""
    by_signature = known if known is not None else {}
    per_layer = []
    for layer in layers:
        key = layer_signature(model, layer)
        if key not in by_signature:
            by_signature[key] = layer_activation_bytes(model, layer, shape, options, moe_scale=moe_scale)
        per_layer.append(by_signature[key])
    if mtp:
        per_layer += [mtp_layer_activation_bytes(model, shape, options, moe_scale=moe_scale)] * mtp
    return per_layer


def full_recompute_bytes(per_layer: list[float], shape: TokenShape, h: int, options: TrainingOptions) -> float:
    """Full recompute: uniform keeps each group of N layers' input 2·T·h/sp; block recomputes the
    first N layers of the chunk (input only) and stores the rest in full (transformer_block.py
    ``_checkpointed_forward``). The recomputed group's live activations count as a transient."""
    checkpoint = BF16 * shape.tokens * h / shape.sp
    n = max(options.recompute_num_layers, 1)
    if options.recompute_method == "block":
        recomputed = min(n, len(per_layer))
        return recomputed * checkpoint + sum(per_layer[recomputed:])
    groups = -(-len(per_layer) // n)
    return groups * checkpoint


def embedding_activation_bytes(model: ModelSpec, shape: TokenShape, options: TrainingOptions) -> float:
    """First stage: embedding output 2·T·h/sp (+ dropout mask)."""
    h = model.hidden_size
    return BF16 * shape.tokens * h / shape.sp + dropout_mask_bytes(shape, h, options.hidden_dropout)
