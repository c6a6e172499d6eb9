"""ModelSpec / HardwareSpec validation, layer patterns, catalogs and the HF config reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from lcmoe.catalog import hardware_names, load_hardware, load_model, load_model_file, model_names
from lcmoe.errors import LcmoeError, UnknownNameError
from lcmoe.specs._validate import validate_or_explain
from lcmoe.specs.hf import model_from_hf_config
from lcmoe.specs.layer_patterns import parse_layer_pattern
from lcmoe.specs.model import ModelSpec
from tests.helpers import HF_FAMILY_BASE

REQUIRED_MODELS = {
    "deepseek-v3",
    "kimi-k2",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "qwen3-next-80b-a3b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "mixtral-8x22b",
    "deepseek-v2-lite",
    "moonlight-16b-a3b",
    "llama3-70b",
    "llama3.1-405b",
    "qwen3.5-397b-a17b",
    "qwen3.5-35b-a3b",
    "deepseek-v4-flash",
}


def test_catalog_has_every_required_model_and_gpu() -> None:
    assert set(model_names()) >= REQUIRED_MODELS
    assert {"h100", "h200", "b200", "b300", "gb200", "gb300"} <= set(hardware_names())


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_every_catalog_model_cites_its_sources(name: str) -> None:
    spec = load_model(name)
    assert spec.sources.get("config")
    assert spec.published is not None and spec.published.source


@pytest.mark.parametrize("name", ["h100", "h200", "b200", "b300", "gb200", "gb300"])
def test_every_hardware_value_has_a_source(name: str) -> None:
    hw = load_hardware(name)
    for field in (
        "hbm_bytes",
        "peak_flops",
        "hbm_bandwidth",
        "nvlink_bandwidth",
        "scaleout_bandwidth",
        "host_link_bandwidth",
        "host_memory_bytes",
    ):
        assert hw.sources.get(field), f"{name}.{field} has no source"


def test_megatron_pattern_expression_is_parsed_without_eval() -> None:
    assert parse_layer_pattern("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert parse_layer_pattern("[1,0,1]") == [1, 0, 1]
    assert parse_layer_pattern("4") == 4
    with pytest.raises(ValueError):
        parse_layer_pattern("__import__('os').system('true')")


def test_deepseek_v3_layer_patterns() -> None:
    spec = load_model("deepseek-v3")
    assert spec.moe_layer_pattern()[:4] == [False, False, False, True]
    assert sum(spec.moe_layer_pattern()) == 58


def test_qwen3_next_has_12_full_attention_layers() -> None:
    # full iff (i+1) % 4 == 0 → layers 3, 7, …, 47
    spec = load_model("qwen3-next-80b-a3b")
    assert spec.linear_attention_pattern().count(False) == 12
    assert spec.linear_attention_pattern()[3] is False and spec.linear_attention_pattern()[0] is True


def test_gpt_oss_alternates_sliding_and_full_attention() -> None:
    spec = load_model("gpt-oss-120b")
    assert spec.sliding_window_pattern()[:4] == [True, False, True, False]
    assert spec.window_tokens == 128


def test_padded_vocab_follows_megatron() -> None:
    spec = load_model("qwen3-30b-a3b")  # 151936 = 1187·128
    assert spec.padded_vocab_size(1) == 151936
    assert spec.padded_vocab_size(8) == 152576  # ceil(151936 / 1024)·1024


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_model("deepsek-v3")
    assert "deepseek-v3" in str(info.value)


def test_invalid_spec_names_the_field() -> None:
    data = load_model("llama3-8b").model_dump()
    data["num_query_groups"] = 7
    with pytest.raises(Exception) as info:
        ModelSpec.model_validate(data)
    assert "num_query_groups" in str(info.value)


def test_bad_user_yaml_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: x\nnum_layers: -3\nhidden_size: 8\nffn_hidden_size: 8\nnum_attention_heads: 1\nvocab_size: 10\n"
    )
    with pytest.raises(LcmoeError) as info:
        load_model_file(path)
    assert "num_layers" in str(info.value) and "-3" in str(info.value)


def _hf_config(spec: ModelSpec) -> dict[str, object]:
    """DeepSeek-V3's config.json, written from the catalog values."""
    return {
        "model_type": "deepseek_v3",
        "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": 128,
        "vocab_size": spec.vocab_size,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
    }


def test_hf_config_reproduces_the_catalog_flops(tmp_path: Path) -> None:
    from lcmoe.estimate.flops import flops_per_token

    catalog = load_model("deepseek-v3")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_hf_config(catalog)))
    spec = model_from_hf_config(path)
    assert flops_per_token(spec, 4096).total == pytest.approx(flops_per_token(catalog, 4096).total, rel=1e-12)


def test_hf_config_missing_field_is_named(tmp_path: Path) -> None:
    data = _hf_config(load_model("deepseek-v3"))
    del data["kv_lora_rank"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LcmoeError) as info:
        model_from_hf_config(path)
    assert "kv_lora_rank" in str(info.value) and "missing" in str(info.value)


def test_hf_config_unsupported_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(LcmoeError) as info:
        model_from_hf_config(path)
    assert "model_type" in str(info.value) and "bert" in str(info.value)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_next", "gpt_oss", "mixtral", "llama", "qwen3", "glm4_moe"])
def test_hf_config_each_family_builds(tmp_path: Path, model_type: str) -> None:
    base: dict[str, object] = dict(HF_FAMILY_BASE, model_type=model_type)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base))
    spec = model_from_hf_config(path)
    assert spec.num_layers == 8


def test_a_bad_field_with_control_characters_stays_one_sentence() -> None:
    # Found by benchmarks/fuzz.py (hardware-yaml): a `sources` key of "\n\f" broke the sentence.
    class Spec(BaseModel):
        sources: dict[str, str]

    with pytest.raises(LcmoeError) as err:
        validate_or_explain(Spec, {"sources": {"\n\x0c": 1}}, origin="fuzz.yaml")
    text = str(err.value)
    assert text.isprintable() and "'\\n\\x0c'" in text


def test_qwen3_5_397b_has_15_gated_attention_layers_and_gdn_elsewhere() -> None:
    spec = load_model("qwen3.5-397b-a17b")
    assert spec.linear_attention_pattern().count(False) == 15
    assert spec.attention_label == "GQA+GDN" and spec.cost_model_gaps == ()


def test_deepseek_v4_flash_layer_kinds_and_indexers() -> None:
    from lcmoe.specs.layer_patterns import AttentionKind
    from lcmoe.specs.layers import mixer_kind

    spec = load_model("deepseek-v4-flash")
    assert spec.attention_label == "CSA"
    assert all(mixer_kind(spec, i) is AttentionKind.CSA for i in range(spec.num_layers + 1))
    # ratio-4 layers (2, 4, ..., 42) hold the indexer; the two window-only layers and MTP do not
    assert [i for i in range(spec.num_layers) if spec.has_dsa_indexer(i)] == list(range(2, 43, 2))
    assert not spec.has_dsa_indexer(spec.mtp_layer)
    assert spec.csa_compress_ratio(3) == 128 and spec.csa_compress_ratio(spec.mtp_layer) == 0


def test_a_model_whose_cost_is_not_modelled_is_refused_in_one_sentence() -> None:
    from lcmoe.specs.layers import attention_kind

    spec = load_model("deepseek-v4-flash")
    with pytest.raises(LcmoeError, match="time and memory are not modelled for its DeepSeek-V4") as err:
        attention_kind(spec, 0)
    assert "hyper-connections (4 residual streams)" in str(err.value) and "\n" not in str(err.value)


def test_csa_ratios_must_cover_every_layer_and_mtp() -> None:
    data = load_model("deepseek-v4-flash").model_dump(exclude_none=True)
    data["csa_compress_ratios"] = data["csa_compress_ratios"][:-1]
    with pytest.raises(LcmoeError, match="num_layers \\+ mtp_num_layers = 44"):
        validate_or_explain(ModelSpec, data, origin="test")


def test_hf_qwen3_5_moe_multimodal_config_reads_its_language_model(tmp_path: Path) -> None:
    # The release's config.json wraps the LM in text_config (model_type qwen3_5_moe_text) and has
    # no dense intermediate_size (transformers Qwen3_5MoeTextConfig).
    from lcmoe.estimate.params import count_params

    text = {
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": 60,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 248320,
        "tie_word_embeddings": False,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(60)],
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mtp_num_hidden_layers": 1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text, "vision_config": {"depth": 27}}))
    spec = model_from_hf_config(path)
    assert count_params(spec).total == count_params(load_model("qwen3.5-397b-a17b")).total


def test_hf_deepseek_v4_config_matches_the_catalog(tmp_path: Path) -> None:
    from lcmoe.estimate.params import count_params

    ratios = [0, 0] + [4, 128] * 20 + [4]  # 43 decoder layers; the MTP layer's 0 is appended
    data = {
        "model_type": "deepseek_v4",
        "num_hidden_layers": 43,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "sliding_window": 128,
        "compress_ratios": ratios,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "hc_mult": 4,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048,
        "num_hash_layers": 3,
        "num_nextn_predict_layers": 1,
        "vocab_size": 129280,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    spec = model_from_hf_config(path)
    catalog = load_model("deepseek-v4-flash")
    assert spec.csa_compress_ratios == catalog.csa_compress_ratios
    assert count_params(spec).total == count_params(catalog).total
    del data["compress_ratios"]
    path.write_text(json.dumps(data))
    with pytest.raises(LcmoeError, match="compress_ratios"):
        model_from_hf_config(path)
