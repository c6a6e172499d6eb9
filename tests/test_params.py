"""Parameter counts against the publishers' own figures (within 1%, or one stated unit)."""

from __future__ import annotations

import pytest

from lcmoe.catalog import load_model, model_names
from lcmoe.estimate.params import active_as_published, count_params, gqa_attention_params

# Kimi K2's report states 1.04T total; counting its config.json gives 1.026T (−1.3%). The count
# follows the released config exactly, so the gap is in what the report includes.
KNOWN_TOTAL_GAPS = {"kimi-k2"}


@pytest.mark.parametrize("name", model_names())
def test_total_params_match_published(name: str) -> None:
    spec = load_model(name)
    assert spec.published is not None
    ours = count_params(spec, include_mtp=spec.published.includes_mtp).total / 1e9
    published = spec.published.total_billions
    if name in KNOWN_TOTAL_GAPS:
        assert abs(ours / published - 1) < 0.02
        pytest.xfail(f"{name}: {ours:.1f}B vs published {published}B (documented gap)")
    assert abs(ours - published) <= spec.published.tolerance(published)


@pytest.mark.parametrize("name", model_names())
def test_active_params_match_published(name: str) -> None:
    spec = load_model(name)
    assert spec.published is not None
    if spec.published.active_billions is None:
        pytest.skip("dense model: no separate active count")
    ours = active_as_published(spec, count_params(spec, include_mtp=False)) / 1e9
    assert abs(ours - spec.published.active_billions) <= spec.published.tolerance(spec.published.active_billions)


def test_deepseek_v3_mtp_adds_about_11_to_14_billion() -> None:
    # DeepSeek-V3 report: 14B MTP module including its own embedding copy; lcmoe shares the
    # embedding/output with the main model as Megatron does, so one layer + projections ≈ 11.6B.
    spec = load_model("deepseek-v3")
    extra = (count_params(spec).total - count_params(spec, include_mtp=False).total) / 1e9
    assert 11 < extra < 14


def test_gqa_attention_params_by_hand() -> None:
    # Llama3-8B: q 4096·4096 + k,v 2·4096·1024 + o 4096·4096 + input norm 4096
    spec = load_model("llama3-8b")
    assert gqa_attention_params(spec) == 4096 * 4096 * 2 + 2 * 4096 * 1024 + 4096


def test_deepseek_v4_flash_layers_by_hand() -> None:
    # Reference inference/model.py shapes with h 4096, 64 heads of D 512, rq 1024, 8 groups of
    # rank 1024; mHC with 4 streams (hyper_connection.py:182-193): 4·4096·24 + 24 + 3 per sublayer.
    from lcmoe.estimate.params import (
        csa_attention_params,
        csa_compressor_params,
        csa_indexer_params,
        hyper_connection_params,
        layer_params,
    )

    spec = load_model("deepseek-v4-flash")
    h = 4096
    attention = h * 1024 + 1024 + 1024 * 64 * 512 + h * 512 + 512 + 4096 * 8192 + 8192 * h + 64 + h
    assert csa_attention_params(spec) == attention
    assert hyper_connection_params(spec) == 4 * h * 24 + 24 + 3
    # ratio 4: overlapping (two widths) compressor of D plus the indexer and its own compressor
    assert csa_compressor_params(spec, 4, 512) == 4 * 1024 + 2 * h * 1024 + 512
    assert csa_indexer_params(spec) == 1024 * 64 * 128 + h * 64 + 4 * 256 + 2 * h * 256 + 128
    assert csa_compressor_params(spec, 128, 512) == 128 * 512 + 2 * h * 512 + 512
    hc = hyper_connection_params(spec)
    assert layer_params(spec, 0).attention == attention + hc  # sliding window only
    assert layer_params(spec, 3).attention == attention + csa_compressor_params(spec, 128, 512) + hc


def test_qwen3_5_shared_expert_width_decides_active() -> None:
    # Bridge's unit-test fixture writes shared_expert_intermediate_size 4096 for 397B-A17B; the
    # config's 1024 is what gives the stated 17B active (4096 would give 19.6B).
    spec = load_model("qwen3.5-397b-a17b")
    wide = spec.model_copy(update={"moe_shared_expert_intermediate_size": 4096})
    assert abs(count_params(spec, include_mtp=False).active / 1e9 - 17) < 0.5
    assert count_params(wide, include_mtp=False).active / 1e9 > 19
