"""Read a local Hugging Face ``config.json`` into a ModelSpec (no network).

The field mapping follows Megatron Bridge's conversion (``model_bridge.py:456-500`` and the
per-family bridges cited in megatron-bridge-facts.md §3.1): ``num_hidden_layers→num_layers``,
``intermediate_size→ffn_hidden_size``, ``num_key_value_heads→num_query_groups``,
``head_dim→kv_channels``, ``n_routed_experts|num_experts|num_local_experts→num_moe_experts``,
``num_experts_per_tok→moe_router_topk``, ``moe_intermediate_size→moe_ffn_hidden_size``,
``qk_nope_head_dim→qk_head_dim``, ``qk_rope_head_dim→qk_pos_emb_head_dim``,
``num_nextn_predict_layers|mtp_num_hidden_layers→mtp_num_layers``. Configs without a dense
``intermediate_size`` (Qwen3.5 MoE, DeepSeek-V4: every layer is MoE) take ``moe_intermediate_size``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.safe_io import load_json, read_text_capped
from lcmoe.specs.model import ModelSpec, model_from_dict

SUPPORTED_MODEL_TYPES = (
    "deepseek_v3",
    "kimi_k2",
    "deepseek_v2",
    "glm_moe_dsa",
    "glm4_moe",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5_moe_text",
    "deepseek_v4",
    "gpt_oss",
    "mixtral",
    "llama",
    "qwen3",
    "nemotron_h",
)


# ModelSpec.num_layers' bound; checked before per-layer patterns are built from it.
MAX_LAYERS = 100_000


class _Config:
    """A config.json mapping with typed, sentence-raising accessors."""

    def __init__(self, data: dict[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def _fail(self, key: str, value: object, rule: str) -> LcmoeError:
        return LcmoeError(f"{self.origin}: {key}", value, rule, "fix config.json or describe the model in lcmoe YAML")

    def integer(self, key: str, default: int | None = None, *, minimum: int = 1, maximum: int | None = None) -> int:
        if key not in self.data or self.data[key] is None:
            if default is None:
                raise self._fail(key, None, "is missing and lcmoe needs it")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, value, "must be a whole number")
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            raise self._fail(key, value, "must be a whole number")
        if value < minimum:
            raise self._fail(key, value, f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise self._fail(key, value, f"must be at most {maximum}")
        return int(value)

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        return None if self.data.get(key) is None else self.integer(key, minimum=minimum)

    def first_int(self, keys: tuple[str, ...], default: int | None = None, *, minimum: int = 1) -> int:
        for key in keys:
            if self.data.get(key) is not None:
                return self.integer(key, minimum=minimum)
        if default is None:
            raise self._fail(" or ".join(keys), None, "is missing and lcmoe needs it")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, value, "must be true or false")
        return value

    def int_list(self, key: str) -> list[int] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self._fail(key, "(list)", "must be a list of whole numbers")
        return value

    def str_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "(list)", "must be a list of strings")
        return value


def model_from_hf_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a local ``config.json`` (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise LcmoeError("config", str(p), "does not exist", "pass a local config.json")
    # A regular file of bounded size, parsed with bounded nesting and integer length (safe_io).
    data = load_json(read_text_capped(p, field="config"), origin=str(p))
    if not isinstance(data, dict):
        raise LcmoeError("config", str(p), "must hold a JSON object", "pass a Hugging Face config.json")
    # Multimodal wrappers keep the language model under text_config.
    if isinstance(data.get("text_config"), dict) and "num_hidden_layers" not in data:
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    return model_from_hf_dict(data, name=name or p.parent.name or "hf-model", origin=str(p))


def model_from_hf_dict(data: dict[str, Any], *, name: str, origin: str = "config.json") -> ModelSpec:
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise LcmoeError(
            f"{origin}: model_type",
            model_type,
            "is not a supported architecture",
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}; or describe the model in lcmoe YAML",
        )
    cfg = _Config(data, origin)
    builder = _BUILDERS[str(model_type)]
    fields = _common_fields(cfg)
    fields.update(builder(cfg))
    fields.update(name=name, family=str(model_type), sources={"config": f"Hugging Face config.json ({origin})"})
    return model_from_dict(fields, origin=origin)


def _common_fields(cfg: _Config) -> dict[str, Any]:
    heads = cfg.integer("num_attention_heads")
    return {
        "num_layers": cfg.integer("num_hidden_layers", maximum=MAX_LAYERS),
        "hidden_size": cfg.integer("hidden_size"),
        "ffn_hidden_size": cfg.first_int(("intermediate_size", "moe_intermediate_size")),
        "num_attention_heads": heads,
        "num_query_groups": cfg.integer("num_key_value_heads", heads),
        "kv_channels": cfg.opt_int("head_dim"),
        "vocab_size": cfg.integer("vocab_size"),
        "untie_embeddings_and_output_weights": not cfg.flag("tie_word_embeddings", False),
        "mtp_num_layers": cfg.first_int(("num_nextn_predict_layers", "mtp_num_hidden_layers"), 0, minimum=0),
    }


def _deepseek(cfg: _Config) -> dict[str, Any]:
    """DeepSeek-V2/V3, Kimi-K2 (deepseek_v3_bridge.py:53-99, kimi_bridge.py:44-88)."""
    num_layers = cfg.integer("num_hidden_layers", maximum=MAX_LAYERS)
    first_dense = cfg.integer("first_k_dense_replace", 0, minimum=0)
    freq = cfg.integer("moe_layer_freq", 1)
    pattern = [int(i >= first_dense and i % freq == 0) for i in range(num_layers)]
    moe_ffn = cfg.integer("moe_intermediate_size")
    shared = cfg.integer("n_shared_experts", 0, minimum=0)
    return {
        "multi_latent_attention": True,
        "num_query_groups": None,
        "kv_channels": None,
        "q_lora_rank": cfg.opt_int("q_lora_rank"),
        "kv_lora_rank": cfg.integer("kv_lora_rank"),
        "qk_head_dim": cfg.integer("qk_nope_head_dim"),
        "qk_pos_emb_head_dim": cfg.integer("qk_rope_head_dim"),
        "v_head_dim": cfg.integer("v_head_dim"),
        "num_moe_experts": cfg.integer("n_routed_experts"),
        "moe_router_topk": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": moe_ffn * shared or None,
        "moe_layer_freq": pattern,
        "moe_router_num_groups": cfg.opt_int("n_group"),
        "moe_router_group_topk": cfg.opt_int("topk_group"),
        "moe_router_enable_expert_bias": cfg.data.get("topk_method") == "noaux_tc",
        "make_vocab_size_divisible_by": 1280 if cfg.data.get("model_type") in ("deepseek_v3", "kimi_k2") else 128,
    }


def _glm_moe_dsa(cfg: _Config) -> dict[str, Any]:
    """GLM-5 / 5.1 / 5.2 (glm5_bridge.py:78-140): DeepSeek-V3's MLA and MoE mapping plus the DSA
    indexer (index_n_heads, index_head_dim, index_topk, and index_topk_freq /
    index_skip_topk_offset where the config shares top-k indices); the provider trains the
    indexer with the sparse KL loss at 0.001 and pads the vocabulary to 1280."""
    fields = _deepseek(cfg)
    fields.update(
        dsa_indexer_n_heads=cfg.integer("index_n_heads"),
        dsa_indexer_head_dim=cfg.integer("index_head_dim"),
        dsa_indexer_topk=cfg.integer("index_topk"),
        dsa_indexer_topk_freq=cfg.integer("index_topk_freq", 1),
        dsa_indexer_skip_topk_offset=cfg.integer("index_skip_topk_offset", 0, minimum=0),
        make_vocab_size_divisible_by=1280,
        dsa_indexer_loss_coeff=0.001,
        dsa_indexer_use_sparse_loss=True,
    )
    return fields


def _glm4_moe(cfg: _Config) -> dict[str, Any]:
    num_layers = cfg.integer("num_hidden_layers", maximum=MAX_LAYERS)
    first_dense = cfg.integer("first_k_dense_replace", 0, minimum=0)
    moe_ffn = cfg.integer("moe_intermediate_size")
    return {
        "num_moe_experts": cfg.integer("n_routed_experts"),
        "moe_router_topk": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": moe_ffn * cfg.integer("n_shared_experts", 0, minimum=0) or None,
        "moe_layer_freq": [int(i >= first_dense) for i in range(num_layers)],
        "moe_router_enable_expert_bias": True,
        "qk_layernorm": cfg.flag("use_qk_norm", False),
        "add_qkv_bias": cfg.flag("attention_bias", False),
    }


def _qwen3_moe(cfg: _Config) -> dict[str, Any]:
    num_layers = cfg.integer("num_hidden_layers", maximum=MAX_LAYERS)
    step = cfg.integer("decoder_sparse_step", 1)
    dense_only = set(cfg.data.get("mlp_only_layers") or [])
    return {
        "num_moe_experts": cfg.integer("num_experts"),
        "moe_router_topk": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": cfg.integer("moe_intermediate_size"),
        "moe_layer_freq": [int(i not in dense_only and (i + 1) % step == 0) for i in range(num_layers)],
        "qk_layernorm": True,
    }


def _qwen3_next(cfg: _Config) -> dict[str, Any]:
    fields = _qwen3_moe(cfg)
    layer_types = cfg.str_list("layer_types")
    linear: int | list[int] = (
        [int(t == "linear_attention") for t in layer_types]
        if layer_types
        else cfg.integer("full_attention_interval", 4)
    )
    fields.update(
        moe_shared_expert_intermediate_size=cfg.opt_int("shared_expert_intermediate_size"),
        moe_shared_expert_gate=cfg.opt_int("shared_expert_intermediate_size") is not None,
        attention_output_gate=True,
        linear_attention_type="gdn",
        linear_attention_freq=linear,
        linear_num_key_heads=cfg.integer("linear_num_key_heads"),
        linear_num_value_heads=cfg.integer("linear_num_value_heads"),
        linear_key_head_dim=cfg.integer("linear_key_head_dim"),
        linear_value_head_dim=cfg.integer("linear_value_head_dim"),
        linear_conv_kernel_dim=cfg.integer("linear_conv_kernel_dim"),
    )
    return fields


def _deepseek_v4(cfg: _Config) -> dict[str, Any]:
    """DeepSeek-V4 (deepseek_v4_bridge.py:390-525): one shared KV head of ``head_dim`` (so
    kv_lora_rank = v_head_dim = head_dim and qk_head_dim = head_dim − qk_rope_head_dim), q LoRA,
    grouped low-rank output (``o_groups``, ``o_lora_rank``), per-layer ``compress_ratios`` (MTP
    layers 0 when the list stops at the decoder, :187-225), the DSA indexer (``index_*``),
    ``hc_mult`` hyper-connection streams, every layer MoE with ``num_hash_layers`` hash-routed
    ones first, shared experts of ``moe_intermediate_size·n_shared_experts``, vocabulary padded
    to 1280."""
    num_layers = cfg.integer("num_hidden_layers", maximum=MAX_LAYERS)
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    ratios = cfg.int_list("compress_ratios")
    if ratios is None:
        raise cfg._fail("compress_ratios", None, "is missing; DeepSeek-V4 needs its per-layer compress ratios")
    if len(ratios) == num_layers:
        ratios = ratios + [0] * mtp
    head_dim, rope = cfg.integer("head_dim"), cfg.integer("qk_rope_head_dim")
    moe_ffn = cfg.integer("moe_intermediate_size")
    return {
        "multi_latent_attention": True,
        "num_query_groups": None,
        "kv_channels": None,
        "qk_layernorm": True,
        "q_lora_rank": cfg.integer("q_lora_rank"),
        "kv_lora_rank": head_dim,
        "qk_head_dim": head_dim - rope,
        "qk_pos_emb_head_dim": rope,
        "v_head_dim": head_dim,
        "o_groups": cfg.integer("o_groups"),
        "o_lora_rank": cfg.integer("o_lora_rank"),
        "csa_compress_ratios": tuple(ratios[: num_layers + mtp]),
        "csa_window_size": cfg.integer("sliding_window", 0, minimum=0),
        "dsa_indexer_n_heads": cfg.integer("index_n_heads"),
        "dsa_indexer_head_dim": cfg.integer("index_head_dim"),
        "dsa_indexer_topk": cfg.integer("index_topk"),
        "mhc_num_residual_streams": cfg.integer("hc_mult", 0, minimum=0),
        "num_moe_experts": cfg.integer("n_routed_experts"),
        "moe_router_topk": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": moe_ffn * cfg.integer("n_shared_experts", 0, minimum=0) or None,
        "moe_router_enable_expert_bias": True,
        "moe_n_hash_layers": cfg.integer("num_hash_layers", 0, minimum=0),
        "make_vocab_size_divisible_by": 1280,
    }


def _gpt_oss(cfg: _Config) -> dict[str, Any]:
    window = cfg.integer("sliding_window", 128)
    layer_types = cfg.str_list("layer_types")
    skip: int | list[int] = [int(t == "sliding_attention") for t in layer_types] if layer_types else 2
    return {
        "num_moe_experts": cfg.first_int(("num_local_experts", "num_experts")),
        "moe_router_topk": cfg.first_int(("num_experts_per_tok", "experts_per_token")),
        "moe_ffn_hidden_size": cfg.integer("intermediate_size"),
        "moe_expert_bias": True,
        "add_qkv_bias": True,
        "add_bias_linear": True,
        "softmax_sinks": True,
        "window_size": (window - 1, 0),
        "window_attn_skip_freq": skip,
    }


def _mixtral(cfg: _Config) -> dict[str, Any]:
    return {
        "num_moe_experts": cfg.integer("num_local_experts"),
        "moe_router_topk": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": cfg.integer("intermediate_size"),
    }


def _nemotron_h(cfg: _Config) -> dict[str, Any]:
    """Nemotron-H / Nemotron-3 hybrids (nemotron_h_bridge.py provider_bridge): the layer pattern
    ``hybrid_override_pattern`` plus one ``/``-separated MTP depth per ``num_nextn_predict_layers``
    (``mtp_hybrid_override_pattern``); squared-ReLU MLPs (no GLU); sigmoid router with expert
    bias; LatentMoE's ``moe_latent_size`` (Nemotron-3 Super, nemotron_h_bridge.py:320-321)."""
    pattern = cfg.data.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise cfg._fail("hybrid_override_pattern", pattern, "must be the hybrid layer pattern string")
    depths = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    mtp = cfg.data.get("mtp_hybrid_override_pattern") if depths else None
    if depths and not isinstance(mtp, str):
        raise cfg._fail("mtp_hybrid_override_pattern", mtp, "must be set when num_nextn_predict_layers > 0")
    fields: dict[str, Any] = {
        "hybrid_layer_pattern": pattern + f"/{mtp}" * depths,
        "mtp_num_layers": depths,
        "gated_linear_unit": False,
        "kv_channels": cfg.opt_int("head_dim") or cfg.opt_int("attention_head_dim"),
        "mamba_num_heads": cfg.integer("mamba_num_heads"),
        "mamba_head_dim": cfg.integer("mamba_head_dim"),
        "mamba_state_dim": cfg.integer("ssm_state_size"),
        "mamba_num_groups": cfg.integer("n_groups"),
        "mamba_conv_kernel_dim": cfg.integer("conv_kernel", 4),
        "mamba_chunk_size": cfg.integer("chunk_size", 128),
    }
    if cfg.opt_int("n_routed_experts"):
        fields.update(
            num_moe_experts=cfg.integer("n_routed_experts"),
            moe_router_topk=cfg.integer("num_experts_per_tok"),
            moe_ffn_hidden_size=cfg.integer("moe_intermediate_size"),
            moe_shared_expert_intermediate_size=cfg.opt_int("moe_shared_expert_intermediate_size"),
            moe_router_enable_expert_bias=True,
            moe_latent_size=cfg.opt_int("moe_latent_size"),
        )
    return fields


def _dense(cfg: _Config) -> dict[str, Any]:
    return {"qk_layernorm": cfg.data.get("model_type") == "qwen3"}


_BUILDERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "deepseek_v2": _deepseek,
    "glm_moe_dsa": _glm_moe_dsa,
    "glm4_moe": _glm4_moe,
    "qwen3_moe": _qwen3_moe,
    "qwen3_next": _qwen3_next,
    # Qwen3.5 MoE keeps Qwen3-Next's language model (qwen35_bridge.py:40-103); its multimodal
    # wrapper's text_config is unwrapped by model_from_hf_config.
    "qwen3_5_moe_text": _qwen3_next,
    "deepseek_v4": _deepseek_v4,
    "gpt_oss": _gpt_oss,
    "mixtral": _mixtral,
    "llama": _dense,
    "qwen3": _dense,
    "nemotron_h": _nemotron_h,
}
