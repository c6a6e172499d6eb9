"""Published run labels map to catalog models through the model YAMLs' ``published_names``."""

from __future__ import annotations

import pytest

from lcmoe.catalog import catalog_name_for_label, load_model, model_names


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("DeepSeekV3", "deepseek-v3"),
        ("DSV3 685B w/ MTP", "deepseek-v3"),  # long_context.csv
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),  # an HF id: organisation dropped
        ("Qwen3 235B-A22B", "qwen3-235b-a22b"),
        ("Qwen3_30B_a3B", "qwen3-30b-a3b"),
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("LLAMA3.1_405B", "llama3.1-405b"),
        ("Llama3.1 70B", "llama3-70b"),
        ("nemotron_3_5_lightning", "nemotron-3.5-lightning-30b-a3b"),
        ("Nemotron_3_Nano", "nemotron-3-nano-30b-a3b"),
        ("glm5_2", "glm-5.2"),
        ("Qwen3_Next_80B_a3B", "qwen3-next-80b-a3b"),
        ("deepseek_v4_flash", "deepseek-v4-flash"),  # counted, not yet plannable
    ],
)
def test_label_maps_to_catalog_model(label: str, name: str) -> None:
    assert catalog_name_for_label(label) == name


@pytest.mark.parametrize("label", ["Wan 2.1 14B", "MiniMax-M2 (256 experts)", "Qwen3-8B", ""])
def test_unknown_label_maps_to_nothing(label: str) -> None:
    assert catalog_name_for_label(label) is None


def test_every_catalog_model_finds_itself() -> None:
    """A model's own name and each of its published names lead back to it (no two models claim
    the same label)."""
    for name in model_names():
        for label in (name, *load_model(name).published_names):
            assert catalog_name_for_label(label) == name, label
