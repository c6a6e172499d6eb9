"""ModelSpec: what the network is, in Megatron-Core's own vocabulary.

Field names follow Megatron-Core's ``TransformerConfig`` / ``MLATransformerConfig`` (and the
Bridge providers that fill them, megatron-bridge-facts.md §3.1), so a reader can map each
field to the config a run actually uses. How the model is split across GPUs is not here:
that is the ``lcmoe.layout`` package (parallel.py, pipeline.py).

Glossary (used in every formula docstring of lcmoe):
    L   num_layers (decoder layers, MTP excluded)      h   hidden_size
    ffn ffn_hidden_size (dense MLP)                    f_moe moe_ffn_hidden_size
    f_sh moe_shared_expert_intermediate_size           E   num_moe_experts, k = moe_router_topk
    d_e the width routed tokens carry: moe_latent_size (LatentMoE) or h
    n   num_attention_heads, g = num_query_groups, d = kv_channels (head dim)
    V   vocab size padded as Megatron pads it           m   mtp_num_layers
    m_w MTP layers holding weights: 1 with mtp_use_repeated_layer (transformer_config.py:82), else m
    Mamba-2 mixers (hybrid models): nh = mamba_num_heads, hd = mamba_head_dim,
    d_i = nh·hd (d_inner), N = mamba_state_dim, G = mamba_num_groups, W = mamba_conv_kernel_dim
    DeepSeek-V4 (CSA): D = v_head_dim (its one head dim), r = compress ratio of a layer,
    g_o = o_groups, r_o = o_lora_rank, n_hc = mhc_num_residual_streams

Hybrid models (Nemotron-H, Nemotron-3) follow Megatron's ``hybrid_layer_pattern``: one symbol
per layer — ``M`` Mamba-2 mixer, ``*`` self-attention, ``-`` dense MLP, ``E`` MoE — so a layer
holds a sequence mixer *or* an MLP, never both; ``|`` marks pipeline boundaries and ``/``
starts the MTP depths (megatron/core/models/hybrid/hybrid_layer_allocation.py:161-275).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from lcmoe.specs._validate import StrictSpec, validate_or_explain
from lcmoe.specs.layer_patterns import (
    HYBRID_ATTENTION,
    HYBRID_MAMBA,
    HYBRID_MLP,
    HYBRID_MOE,
    AttentionKind,
    LayerPattern,
    expand_layer_pattern,
    hybrid_symbol_counts,
    hybrid_symbols_per_layer,
    parse_layer_pattern,
    split_hybrid_pattern,
)
from lcmoe.specs.model_checks import check_model
from lcmoe.specs.published import PublishedParams

# AttentionKind and split_hybrid_pattern live in specs/layer_patterns.py; the estimators and
# config_io read them from here too.
__all__ = ["AttentionKind", "ModelSpec", "PublishedParams", "model_from_dict", "split_hybrid_pattern"]


class ModelSpec(StrictSpec):
    """A decoder-only transformer, dense or MoE, exactly enough to count its FLOPs and bytes.

    Every size is a positive integer; optional features are ``None``/``False``/0 when absent.
    Layer patterns follow Megatron's two spellings: an int ``f`` (a period) or an explicit
    per-layer 0/1 list of length ``num_layers``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="catalog name, e.g. deepseek-v3")
    family: str = Field(default="gpt", description="HF model_type or Bridge family")
    num_layers: int = Field(gt=0, le=100_000)
    hidden_size: int = Field(gt=0, le=1_000_000)
    ffn_hidden_size: int = Field(gt=0, le=10_000_000, description="dense MLP width")
    num_attention_heads: int = Field(gt=0, le=100_000)
    num_query_groups: int | None = Field(default=None, gt=0, description="GQA KV heads; None = MHA")
    kv_channels: int | None = Field(default=None, gt=0, description="head dim; None = h/n")
    gated_linear_unit: bool = True
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    attention_output_gate: bool = Field(default=False, description="Qwen3-Next gated attention")
    softmax_sinks: bool = Field(default=False, description="learnable attention sinks (GPT-OSS)")

    # Multi-latent attention (DeepSeek-V2/V3, Kimi-K2).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int = Field(default=0, ge=0)
    qk_head_dim: int = Field(default=0, ge=0)
    qk_pos_emb_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)

    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): MLA whose core attention reads only the
    # top-k keys a lightning indexer scores (Megatron experimental_attention_variant="dsa",
    # experimental_attention_variant/dsa.py; Bridge glm5_bridge.py maps the HF index_* fields).
    # With topk_freq > 1 only every freq-th layer after the offset runs an indexer; the others
    # reuse its indices (dsa.py is_dsa_skip_topk_layer).
    dsa_indexer_n_heads: int = Field(default=0, ge=0)
    dsa_indexer_head_dim: int = Field(default=0, ge=0)
    dsa_indexer_topk: int = Field(default=0, ge=0)
    dsa_indexer_topk_freq: int = Field(default=1, gt=0)
    dsa_indexer_skip_topk_offset: int = Field(default=0, ge=0)
    dsa_indexer_loss_coeff: float = Field(default=0.0, ge=0.0, description="indexer KL loss weight (0: no grad)")
    dsa_indexer_use_sparse_loss: bool = Field(default=False, description="KL loss over the selected top-k only")

    # Sliding-window attention (GPT-OSS): window (left, right); a layer is full iff
    # (i+1) % window_attn_skip_freq == 0, or per-layer list with 1 = sliding window.
    window_size: tuple[int, int] | None = None
    window_attn_skip_freq: LayerPattern | None = None

    # Gated DeltaNet linear attention (Qwen3-Next): a layer is full attention iff
    # (i+1) % linear_attention_freq == 0, or per-layer list with 1 = linear attention.
    linear_attention_type: Literal["gdn"] | None = None
    linear_attention_freq: LayerPattern | None = None
    linear_num_key_heads: int = Field(default=0, ge=0)
    linear_num_value_heads: int = Field(default=0, ge=0)
    linear_key_head_dim: int = Field(default=0, ge=0)
    linear_value_head_dim: int = Field(default=0, ge=0)
    linear_conv_kernel_dim: int = Field(default=0, ge=0)

    # DeepSeek-V4 hybrid attention (Megatron experimental_attention_variant="dsv4_hybrid"; Bridge
    # deepseek_v4_bridge.py:397-477): one shared KV head of width D = v_head_dim, q through
    # q_lora_rank, a grouped low-rank output projection (g_o groups of rank r_o), and per layer
    # (MTP layers included) a compress ratio r: 0 = sliding window only, 4 = CSA (overlapping
    # compressed KV plus a DSA indexer picking dsa_indexer_topk compressed keys), 128 = HCA
    # (heavily compressed KV, no indexer); every layer also attends its csa_window_size window.
    csa_compress_ratios: tuple[int, ...] = Field(default=(), description="per layer then MTP layers; () = no CSA")
    csa_window_size: int = Field(default=0, ge=0, description="sliding window every CSA layer attends")
    o_groups: int = Field(default=0, ge=0, description="grouped output projection: groups (wo_a)")
    o_lora_rank: int = Field(default=0, ge=0, description="grouped output projection: rank per group")
    # Manifold-constrained hyper-connections (Megatron enable_mhc_connections with
    # mhc_num_residual_streams, transformer_config.py:1142-1148; hyper_connection.py): the residual
    # is n_hc streams of width h mixed per sublayer. 0 = a plain residual.
    mhc_num_residual_streams: int = Field(default=0, ge=0, le=64)

    # Mixture of experts.
    num_moe_experts: int | None = Field(default=None, gt=0, le=1_000_000)
    moe_router_topk: int = Field(default=0, ge=0)
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    moe_shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    moe_latent_size: int | None = Field(
        default=None, gt=0, description="LatentMoE: routed experts work in this width (Nemotron-3 Super)"
    )
    moe_shared_expert_gate: bool = False
    moe_layer_freq: LayerPattern = 1
    moe_router_num_groups: int | None = Field(default=None, gt=0)
    moe_router_group_topk: int | None = Field(default=None, gt=0)
    moe_router_enable_expert_bias: bool = False
    moe_expert_bias: bool = Field(default=False, description="biases on expert linears (GPT-OSS)")
    moe_n_hash_layers: int = Field(
        default=0,
        ge=0,
        description="first layers routed by a fixed token-id → experts table (DeepSeek-V4 tid2eid, a buffer: "
        "no parameters beyond the router's)",
    )

    mtp_num_layers: int = Field(default=0, ge=0, le=64)
    mtp_use_repeated_layer: bool = Field(
        default=False, description="one MTP layer applied at every depth (weights stored once)"
    )
    vocab_size: int = Field(gt=0, le=100_000_000)
    make_vocab_size_divisible_by: int = Field(default=128, gt=0)
    untie_embeddings_and_output_weights: bool = True
    recipe_pipeline_layouts: dict[str, str] = Field(
        default_factory=dict,
        description="'PPxVPP' -> the pipeline_model_parallel_layout Bridge's recipe sets for that split",
    )

    # Hybrid Mamba models (Nemotron-H / Nemotron-3): one symbol per layer, see the module doc.
    hybrid_layer_pattern: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    mamba_num_heads: int = Field(default=0, ge=0)
    mamba_head_dim: int = Field(default=0, ge=0)
    mamba_state_dim: int = Field(default=0, ge=0)
    mamba_num_groups: int = Field(default=0, ge=0)
    mamba_conv_kernel_dim: int = Field(default=4, gt=0, description="d_conv (MambaMixer default 4)")
    mamba_chunk_size: int = Field(default=128, gt=0, description="SSD chunk length (mamba_chunk_size)")

    published: PublishedParams | None = None
    published_names: tuple[str, ...] = Field(
        default=(),
        description="labels published runs use for this model (perf tables, skill cards, HF ids); "
        "matched by catalog.catalog_name_for_label on letters and digits, as a prefix of the label",
    )
    sources: dict[str, str] = Field(default_factory=dict, description="field -> where its value comes from")

    @field_validator("moe_layer_freq", "window_attn_skip_freq", "linear_attention_freq", mode="before")
    @classmethod
    def _parse_pattern_expression(cls, value: object) -> object:
        return parse_layer_pattern(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        check_model(self)  # specs/model_checks.py: what Megatron-Core would refuse to build
        return self

    # ----- derived sizes ------------------------------------------------------------------
    @property
    def is_csa(self) -> bool:
        """DeepSeek-V4 hybrid attention (per-layer compress ratios)."""
        return bool(self.csa_compress_ratios)

    def csa_compress_ratio(self, layer: int) -> int:
        """r of decoder layer ``layer`` (``mtp_layer`` for the first MTP layer); 0 without CSA or
        past the list (an ``mtp_layer`` index of a model without MTP)."""
        return self.csa_compress_ratios[layer] if layer < len(self.csa_compress_ratios) else 0

    @property
    def cost_model_gaps(self) -> tuple[str, ...]:
        """Parts of this model lcmoe counts (parameters) but whose time and memory it does not
        model; ``plan`` / ``estimate`` refuse such a model rather than print wrong numbers."""
        gaps = []
        if self.is_csa:
            gaps.append("DeepSeek-V4 compressed sparse / heavily compressed attention (CSA/HCA)")
        if self.mhc_num_residual_streams:
            gaps.append(f"hyper-connections ({self.mhc_num_residual_streams} residual streams)")
        return tuple(gaps)

    @property
    def mtp_weight_layers(self) -> int:
        """MTP layers that hold weights (m_w): Megatron builds one layer and applies it at every
        depth with ``mtp_use_repeated_layer`` (gpt_layer_specs.py:779-786), else one per depth."""
        return min(self.mtp_num_layers, 1) if self.mtp_use_repeated_layer else self.mtp_num_layers

    @property
    def is_dsa(self) -> bool:
        """MLA with DeepSeek Sparse Attention (a lightning indexer picks each query's top-k keys)."""
        return self.dsa_indexer_topk > 0

    @property
    def attention_label(self) -> str:
        """The sequence mixers in one word, as ``lcmoe models`` lists them: MLA, MLA+DSA, GQA,
        GQA+GDN (Gated DeltaNet layers), GQA+SWA (sliding-window layers) or CSA (DeepSeek-V4)."""
        if self.is_csa:
            return "CSA"
        if self.multi_latent_attention:
            return "MLA+DSA" if self.is_dsa else "MLA"
        if self.linear_attention_type:
            return "GQA+GDN"
        return "GQA+SWA" if self.window_size else "GQA"

    @property
    def shares_dsa_topk(self) -> bool:
        """DSA whose layers reuse an earlier layer's top-k (``dsa_indexer_topk_freq`` > 1): pipeline
        chunks must start on a layer that computes its own (dsa.py, no cross-PP sharing)."""
        return self.is_dsa and self.dsa_indexer_topk_freq > 1

    def dsa_computes_topk(self, layer_number: int) -> bool:
        """Whether 1-based ``layer_number`` runs its own indexer rather than reusing an earlier
        layer's top-k: layers up to max(offset, 1), then every ``topk_freq``-th (dsa.py
        ``is_dsa_skip_topk_layer``; MTP layers restart the numbering at 1)."""
        offset = max(self.dsa_indexer_skip_topk_offset, 1)
        return max(layer_number - offset, 0) % self.dsa_indexer_topk_freq == 0

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_layer_pattern is not None

    @property
    def mamba_inner_size(self) -> int:
        """d_i = nh·hd (mamba_mixer.py:246-248, with mamba_num_heads set)."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_in_proj_size(self) -> int:
        """in_proj output width 2·d_i + 2·G·N + nh: z, x, B, C, dt (mamba_mixer.py:281-306)."""
        return 2 * self.mamba_inner_size + 2 * self.mamba_num_groups * self.mamba_state_dim + self.mamba_num_heads

    @property
    def mtp_layer(self) -> int:
        """Index that stands for an MTP layer in the per-layer patterns: ``num_layers`` (one past
        the decoder layers). An MTP layer copies the last decoder layer (mtp_block_spec), or, in a
        hybrid model, holds the pattern's MTP depth."""
        return self.num_layers

    @property
    def is_moe(self) -> bool:
        return bool(self.num_moe_experts)

    @property
    def query_groups(self) -> int:
        """g: KV heads (MHA when ``num_query_groups`` is unset)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """d = kv_channels, defaulting to h/n as Megatron does (arguments.py:1331-1333)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn(self) -> int:
        """f_moe, falling back to ffn as Megatron does (arguments.py:1650-1651)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def expert_width(self) -> int:
        """d_e: what a routed token carries through dispatch and the experts. LatentMoE projects
        it h → moe_latent_size before dispatch and back after combine (moe_layer.py:266-300,
        ``fc1_latent_proj`` / ``fc2_latent_proj``; experts.py:219-242 size the experts on it)."""
        return self.moe_latent_size or self.hidden_size

    @property
    def shared_ffn(self) -> int:
        return self.moe_shared_expert_intermediate_size or 0

    @property
    def glu_factor(self) -> int:
        """Number of h×ffn matrices in one MLP: 3 with a gated linear unit (SwiGLU), else 2."""
        return 3 if self.gated_linear_unit else 2

    @property
    def total_layers(self) -> int:
        """L_t = L + m: decoder layers plus MTP layers (each MTP layer holds one transformer layer)."""
        return self.num_layers + self.mtp_num_layers

    def padded_vocab_size(self, tp: int = 1) -> int:
        """V = ceil(vocab / (div·TP)) · div·TP (megatron/training/vocab_utils.py:45-59)."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    # ----- per-layer patterns (decoder layers only; MTP layers copy the last layer) -------
    # Cached: the spec is frozen, and estimators ask for them once per layer.
    # Each tuple has num_layers + 1 entries: the last one (index ``mtp_layer``) is the MTP layer.
    @cached_property
    def _hybrid_symbols(self) -> tuple[str, ...]:
        """Per layer, the hybrid symbols it holds (one, or the MTP depth's mixer and MLP)."""
        return hybrid_symbols_per_layer(self.hybrid_layer_pattern or "")

    def _with_mtp(self, pattern: list[bool]) -> tuple[bool, ...]:
        return (*pattern, pattern[-1])

    @cached_property
    def _moe_pattern(self) -> tuple[bool, ...]:
        if self.is_hybrid:
            return tuple(HYBRID_MOE in symbols for symbols in self._hybrid_symbols)
        if not self.is_moe:
            return (False,) * (self.num_layers + 1)
        moe = expand_layer_pattern(self.moe_layer_freq, self.num_layers, true_if_period_hit=True, offset=0)
        return self._with_mtp(moe)

    @cached_property
    def _mlp_pattern(self) -> tuple[bool, ...]:
        """True where the layer has an MLP (dense or MoE): every transformer layer, and a hybrid
        model's ``-`` / ``E`` layers."""
        if self.is_hybrid:
            return tuple(HYBRID_MLP in symbols or HYBRID_MOE in symbols for symbols in self._hybrid_symbols)
        return (True,) * (self.num_layers + 1)

    @cached_property
    def _linear_pattern(self) -> tuple[bool, ...]:
        if self.linear_attention_type is None or self.linear_attention_freq is None:
            return (False,) * (self.num_layers + 1)
        freq = self.linear_attention_freq
        return self._with_mtp(expand_layer_pattern(freq, self.num_layers, true_if_period_hit=False, offset=1))

    @cached_property
    def _window_pattern(self) -> tuple[bool, ...]:
        if self.window_size is None:
            return (False,) * (self.num_layers + 1)
        if self.window_attn_skip_freq is None:
            return (True,) * (self.num_layers + 1)
        freq = self.window_attn_skip_freq
        window = expand_layer_pattern(freq, self.num_layers, true_if_period_hit=False, offset=1)
        # Bridge numbers a hybrid model's SWA layers by position in the main pattern
        # (flop_utils.py:766-799); its MTP attention stays full.
        return (*window, False) if self.is_hybrid else self._with_mtp(window)

    @cached_property
    def _attention_kinds(self) -> tuple[AttentionKind, ...]:
        """Hybrid: Mamba for ``M``, attention (GQA, or sliding window where the window pattern says
        so) for ``*``, none for MLP-only layers. Otherwise Gated DeltaNet where the linear pattern
        says so, else MLA for MLA models, else sliding window where the window pattern says so,
        else GQA."""

        def kind(layer: int) -> AttentionKind:
            if self.is_hybrid:
                symbols = self._hybrid_symbols[layer]
                if HYBRID_MAMBA in symbols:
                    return AttentionKind.MAMBA
                if HYBRID_ATTENTION not in symbols:
                    return AttentionKind.NONE
            if self._linear_pattern[layer]:
                return AttentionKind.GDN
            if self.is_csa:
                return AttentionKind.CSA
            if self.multi_latent_attention:
                return AttentionKind.MLA
            if self._window_pattern[layer]:
                return AttentionKind.SWA
            return AttentionKind.GQA

        return tuple(kind(layer) for layer in range(self.num_layers + 1))

    @cached_property
    def _indexer_pattern(self) -> tuple[bool, ...]:
        """True where a DSA layer runs its own indexer (decoder layer i is layer number i+1; the
        MTP layer, index ``mtp_layer``, is number 1 of its own block). CSA: the ratio-4 layers."""
        if self.is_csa:
            return tuple(self.csa_compress_ratio(i) == 4 for i in range(self.num_layers + 1))
        if not self.is_dsa:
            return (False,) * (self.num_layers + 1)
        return (*(self.dsa_computes_topk(i + 1) for i in range(self.num_layers)), self.dsa_computes_topk(1))

    @cached_property
    def _layer_signatures(self) -> tuple[tuple[bool, AttentionKind, bool, bool], ...]:
        return tuple(
            zip(self._moe_pattern, self._attention_kinds, self._mlp_pattern, self._indexer_pattern, strict=True)
        )

    def has_dsa_indexer(self, layer: int) -> bool:
        """Whether the layer (or ``mtp_layer``) holds and runs a DSA indexer."""
        return self._indexer_pattern[layer]

    def moe_layer_pattern(self) -> list[bool]:
        """True where decoder layer i is MoE: int f → i % f == 0; list → entry is 1; hybrid: ``E``."""
        return list(self._moe_pattern[: self.num_layers])

    def linear_attention_pattern(self) -> list[bool]:
        """True where layer i is Gated DeltaNet: int f → full iff (i+1) % f == 0; list 1 = linear."""
        return list(self._linear_pattern[: self.num_layers])

    def sliding_window_pattern(self) -> list[bool]:
        """True where layer i uses the sliding window: int f → full iff (i+1) % f == 0; list 1 = SWA."""
        return list(self._window_pattern[: self.num_layers])

    def is_moe_layer(self, layer: int) -> bool:
        """MoE or not; ``layer`` may be ``mtp_layer``."""
        return self._moe_pattern[layer]

    def has_mlp(self, layer: int) -> bool:
        """Whether the layer has an MLP (always, except a hybrid model's mixer-only layers)."""
        return self._mlp_pattern[layer]

    def hybrid_layer_counts(self) -> dict[str, int]:
        """Symbol counts over main layers and MTP depths, as Bridge counts them
        (hybrid_layer_allocation.py:161-197 get_hybrid_layer_counts)."""
        return hybrid_symbol_counts(self.hybrid_layer_pattern or "")

    @property
    def window_tokens(self) -> int:
        """W = window[0] + window[1] + 1 (flop_utils.py sliding-window branch)."""
        return 0 if self.window_size is None else self.window_size[0] + self.window_size[1] + 1


def model_from_dict(data: dict[str, object], *, origin: str) -> ModelSpec:
    """Build a ModelSpec, turning pydantic's report into one sentence naming the field."""
    return validate_or_explain(ModelSpec, data, origin=origin)
