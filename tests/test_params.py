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
