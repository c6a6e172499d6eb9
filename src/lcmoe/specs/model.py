"""ModelSpec: what the network is, in Megatron-Core's own vocabulary.

Field names follow Megatron-Core's ``TransformerConfig`` / ``MLATransformerConfig`` (and the
Bridge providers that fill them, megatron-bridge-facts.md §3.1), so a reader can map each
field to the config a run actually uses. How the model is split across GPUs is not here:
that is ``layout.py``.

Glossary (used in every formula docstring of lcmoe):
    L   num_layers (decoder layers, MTP excluded)      h   hidden_size
    ffn ffn_hidden_size (dense MLP)                    f_moe moe_ffn_hidden_size
    f_sh moe_shared_expert_intermediate_size           E   num_moe_experts, k = moe_router_topk
    n   num_attention_heads, g = num_query_groups, d = kv_channels (head dim)
    V   vocab size padded as Megatron pads it           m   mtp_num_layers
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lcmoe.specs._validate import validate_or_explain

LayerPattern = int | list[int]


class PublishedParams(BaseModel):
    """Parameter counts as their publisher states them, to check lcmoe's own count against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_billions: float = Field(gt=0)
    active_billions: float | None = Field(default=None, gt=0)
    stated_unit_billions: float = Field(
        default=0.01, gt=0, description="unit of the last stated digit: 1 for '37B', 0.01 for '116.83B'"
    )
    includes_mtp: bool = False
    active_convention: Literal["all", "no_input_embedding", "no_embeddings"] = Field(
        default="all", description="which embedding matrices the publisher leaves out of 'active'"
    )
    source: str

    def tolerance(self, value_billions: float) -> float:
        """Allowed |ours − published| in billions: 1%, or one stated unit if that is larger.

        A figure stated as "3.3B" may be 3.25–3.35 rounded or 3.30–3.39 truncated; publishers do
        not say which, so one whole unit is the honest bound.
        """
        return max(0.01 * value_billions, self.stated_unit_billions)


class AttentionKind(str, Enum):
    MLA = "mla"
    GQA = "gqa"
    SWA = "swa"
    GDN = "gdn"


class ModelSpec(BaseModel):
    """A decoder-only transformer, dense or MoE, exactly enough to count its FLOPs and bytes.

    Every size is a positive integer; optional features are ``None``/``False``/0 when absent.
    Layer patterns follow Megatron's two spellings: an int ``f`` (a period) or an explicit
    per-layer 0/1 list of length ``num_layers``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="catalog name, e.g. deepseek-v3")
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

    # Mixture of experts.
    num_moe_experts: int | None = Field(default=None, gt=0, le=1_000_000)
    moe_router_topk: int = Field(default=0, ge=0)
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    moe_shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    moe_shared_expert_gate: bool = False
    moe_layer_freq: LayerPattern = 1
    moe_router_num_groups: int | None = Field(default=None, gt=0)
    moe_router_group_topk: int | None = Field(default=None, gt=0)
    moe_router_enable_expert_bias: bool = False
    moe_expert_bias: bool = Field(default=False, description="biases on expert linears (GPT-OSS)")

    mtp_num_layers: int = Field(default=0, ge=0, le=64)
    vocab_size: int = Field(gt=0, le=100_000_000)
    make_vocab_size_divisible_by: int = Field(default=128, gt=0)
    untie_embeddings_and_output_weights: bool = True

    published: PublishedParams | None = None
    sources: dict[str, str] = Field(default_factory=dict, description="field -> where its value comes from")

    @field_validator("moe_layer_freq", "window_attn_skip_freq", "linear_attention_freq", mode="before")
    @classmethod
    def _parse_pattern_expression(cls, value: object) -> object:
        return parse_layer_pattern(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        n = self.num_attention_heads
        if self.num_query_groups is not None and n % self.num_query_groups:
            raise ValueError(f"num_query_groups = {self.num_query_groups} must divide num_attention_heads = {n}")
        if self.multi_latent_attention and not (self.kv_lora_rank and self.qk_head_dim and self.v_head_dim):
            raise ValueError("multi_latent_attention needs kv_lora_rank, qk_head_dim and v_head_dim > 0")
        if self.num_moe_experts:
            if not 0 < self.moe_router_topk <= self.num_moe_experts:
                raise ValueError(
                    f"moe_router_topk = {self.moe_router_topk} must be in 1..num_moe_experts ({self.num_moe_experts})"
                )
        elif self.moe_router_topk:
            raise ValueError("moe_router_topk is set but num_moe_experts is not")
        if self.linear_attention_type == "gdn" and not (
            self.linear_num_key_heads
            and self.linear_num_value_heads
            and self.linear_key_head_dim
            and self.linear_value_head_dim
            and self.linear_conv_kernel_dim
        ):
            raise ValueError("gated delta net needs linear key/value heads, head dims and conv kernel > 0")
        if self.window_size is not None and (self.window_size[0] < 0 or self.window_size[1] < 0):
            raise ValueError(f"window_size = {self.window_size} must be two non-negative numbers")
        for field in ("moe_layer_freq", "window_attn_skip_freq", "linear_attention_freq"):
            pattern = getattr(self, field)
            if isinstance(pattern, list):
                if len(pattern) != self.num_layers or any(v not in (0, 1) for v in pattern):
                    raise ValueError(f"{field} as a list must have num_layers = {self.num_layers} entries of 0 or 1")
            elif pattern is not None and pattern <= 0:
                raise ValueError(f"{field} = {pattern} must be a positive period")
        return self

    # ----- derived sizes ------------------------------------------------------------------
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
    @cached_property
    def _moe_pattern(self) -> tuple[bool, ...]:
        if not self.is_moe:
            return (False,) * self.num_layers
        return tuple(_pattern(self.moe_layer_freq, self.num_layers, true_if_period_hit=True, offset=0))

    @cached_property
    def _linear_pattern(self) -> tuple[bool, ...]:
        if self.linear_attention_type is None or self.linear_attention_freq is None:
            return (False,) * self.num_layers
        return tuple(_pattern(self.linear_attention_freq, self.num_layers, true_if_period_hit=False, offset=1))

    @cached_property
    def _window_pattern(self) -> tuple[bool, ...]:
        if self.window_size is None:
            return (False,) * self.num_layers
        if self.window_attn_skip_freq is None:
            return (True,) * self.num_layers
        return tuple(_pattern(self.window_attn_skip_freq, self.num_layers, true_if_period_hit=False, offset=1))

    @cached_property
    def _attention_kinds(self) -> tuple[AttentionKind, ...]:
        """Gated DeltaNet where the linear pattern says so, else MLA for MLA models, else sliding
        window where the window pattern says so, else GQA."""

        def kind(layer: int) -> AttentionKind:
            if self._linear_pattern[layer]:
                return AttentionKind.GDN
            if self.multi_latent_attention:
                return AttentionKind.MLA
            if self._window_pattern[layer]:
                return AttentionKind.SWA
            return AttentionKind.GQA

        return tuple(kind(layer) for layer in range(self.num_layers))

    @cached_property
    def _layer_signatures(self) -> tuple[tuple[bool, AttentionKind], ...]:
        return tuple(zip(self._moe_pattern, self._attention_kinds, strict=True))

    def moe_layer_pattern(self) -> list[bool]:
        """True where decoder layer i is MoE: int f → i % f == 0; list → entry is 1."""
        return list(self._moe_pattern)

    def linear_attention_pattern(self) -> list[bool]:
        """True where layer i is Gated DeltaNet: int f → full iff (i+1) % f == 0; list 1 = linear."""
        return list(self._linear_pattern)

    def sliding_window_pattern(self) -> list[bool]:
        """True where layer i uses the sliding window: int f → full iff (i+1) % f == 0; list 1 = SWA."""
        return list(self._window_pattern)

    def is_moe_layer(self, layer: int) -> bool:
        return self._moe_pattern[layer]

    @property
    def window_tokens(self) -> int:
        """W = window[0] + window[1] + 1 (flop_utils.py sliding-window branch)."""
        return 0 if self.window_size is None else self.window_size[0] + self.window_size[1] + 1


_PATTERN_TERM = re.compile(r"^\[\s*([01](?:\s*,\s*[01])*)\s*\]\s*(?:\*\s*(\d+))?$")


def parse_layer_pattern(text: str) -> int | list[int]:
    """Parse Megatron's pattern spelling without ``eval``: ``4``, ``([0]*3+[1]*58)``, ``[1,0,1]``.

    Megatron evaluates the string as Python (arguments.py ``moe_freq_type``); lcmoe accepts the
    same list-repeat-concatenate forms and nothing else.
    """
    body = text.strip()
    if re.fullmatch(r"\d+", body):
        return int(body)
    while body.startswith("(") and body.endswith(")"):
        body = body[1:-1].strip()
    result: list[int] = []
    for term in body.split("+"):
        match = _PATTERN_TERM.match(term.strip())
        if not match:
            raise ValueError(f"layer pattern {text!r} is not of the form ([0]*k+[1]*n) or [1,0,...]")
        items = [int(v) for v in match.group(1).split(",")]
        repeat = int(match.group(2) or 1)
        if repeat > 1_000_000:
            raise ValueError(f"layer pattern {text!r} repeats more than 10^6 times")
        result.extend(items * repeat)
    return result


def _pattern(spec: LayerPattern, num_layers: int, *, true_if_period_hit: bool, offset: int) -> list[bool]:
    if isinstance(spec, list):
        return [bool(v) for v in spec]
    return [((i + offset) % spec == 0) == true_if_period_hit for i in range(num_layers)]


def model_from_dict(data: dict[str, object], *, origin: str) -> ModelSpec:
    """Build a ModelSpec, turning pydantic's report into one sentence naming the field."""
    return validate_or_explain(ModelSpec, data, origin=origin)
