from __future__ import annotations

import pytest

from lcmoe.catalog import load_model, model_names
from lcmoe.errors import LcmoeError
from lcmoe.layout import (
    ParallelLayout,
    auto_pipeline_layout,
    check_pipeline_layout,
    inflight_microbatch_chunks,
    parse_pipeline_layout,
    pipeline_stages,
)
from lcmoe.run import resolve_pipeline_layout


def test_parse_megatron_layout_strings() -> None:
    stages = parse_pipeline_layout("Et*3|(tt|)*6mL")
    assert len(stages) == 8
    assert stages[0] == ["E", "t", "t", "t"] and stages[-1] == ["m", "L"]


def test_bad_layout_token_is_one_sentence() -> None:
    with pytest.raises(LcmoeError) as info:
        parse_pipeline_layout("Ex|tL")
    assert "pipeline_layout" in str(info.value)


@pytest.mark.parametrize("pp,vpp", [(4, 1), (8, 1), (8, 4), (16, 1), (4, 4)])
def test_auto_layout_places_every_deepseek_layer_once(pp: int, vpp: int) -> None:
    model = load_model("deepseek-v3")
    text = auto_pipeline_layout(model, pp, vpp)
    assert text is not None
    stages = pipeline_stages(model, ParallelLayout(pp=pp, vpp=vpp, pipeline_layout=text))
    layers = sorted(layer for stage in stages for layer in stage.decoder_layers)
    assert layers == list(range(61))
    assert stages[-1].mtp_layers == 1 and stages[0].has_embedding and stages[-1].has_loss


@pytest.mark.parametrize("name", [n for n in model_names() if load_model(n).recipe_pipeline_layouts])
def test_recipe_layouts_place_every_layer_once(name: str) -> None:
    model = load_model(name)
    for key, text in model.recipe_pipeline_layouts.items():
        pp, vpp = (int(v) for v in key.split("x"))
        layout = ParallelLayout(pp=pp, vpp=vpp, pipeline_layout=text)
        check_pipeline_layout(model, layout)
        stages = pipeline_stages(model, layout)
        assert sorted(layer for s in stages for layer in s.decoder_layers) == list(range(model.num_layers))
        assert stages[0].has_embedding and stages[-1].has_loss and stages[-1].mtp_layers == model.mtp_num_layers


def test_a_models_recipe_layout_is_the_default_and_a_given_one_wins() -> None:
    """Bridge's DeepSeek-V3 recipes put ceil(61/16) = 4 decoders on every virtual stage and the
    last one with MTP and loss (_get_deepseek_v3_pipeline_layout); lcmoe's balanced layout is
    the fallback for splits the recipe does not list."""
    model = load_model("deepseek-v3")
    assert resolve_pipeline_layout(model, 4, 4, None) == "Et*4|(t*4|)*14tmL"
    assert resolve_pipeline_layout(model, 2, 8, None) == auto_pipeline_layout(model, 2, 8)
    assert resolve_pipeline_layout(model, 4, 4, "Et*3|(t*4|)*14t*2mL") == "Et*3|(t*4|)*14t*2mL"
    with pytest.raises(ValueError, match="PPxVPP"):
        type(model).model_validate(model.model_dump() | {"recipe_pipeline_layouts": {"4": "Et*61mL"}})


def test_even_split_with_account_for_flags() -> None:
    # Qwen3-235B: 94 layers + embedding + loss = 96 → PP 4 gives 23, 24, 24, 23.
    model = load_model("qwen3-235b-a22b")
    layout = ParallelLayout(pp=4, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert [len(s.decoder_layers) for s in pipeline_stages(model, layout)] == [23, 24, 24, 23]


def test_inflight_microbatches_1f1b_and_interleaved() -> None:
    # 1F1B: rank r holds min(pp − r, M); interleaved rank 0: 2(pp−1) + (vpp−1)·pp + 1 chunks.
    assert inflight_microbatch_chunks(ParallelLayout(pp=4, dp=1, gbs=16), 0) == 4
    assert inflight_microbatch_chunks(ParallelLayout(pp=4, dp=1, gbs=16), 3) == 1
    assert inflight_microbatch_chunks(ParallelLayout(pp=4, vpp=2, dp=1, gbs=16), 0) == 2 * 3 + 4 + 1


def test_layout_rejects_non_positive_sizes() -> None:
    with pytest.raises(LcmoeError):
        ParallelLayout(tp=0)
