"""``SharedLayerBytes``: memory estimates that share per-layer bytes across layouts and options
(the plan search) give the same estimates as estimates that start empty."""

from __future__ import annotations

import pytest

from lcmoe.estimate.memory import (
    SharedLayerBytes,
    chunk_activation_bytes,
    estimate_memory,
    stage_inputs,
    staged_layout,
    token_shape,
)
from lcmoe.estimate.memory.stage import _chunk_activation_bytes
from tests.helpers import make_run, with_options

# Layouts that share a token shape (PP, VPP, GBS differ) and some that do not (TP, CP, MBS).
LAYOUTS = (
    {},
    {"pp": 4, "vpp": 1},
    {"pp": 16, "vpp": 1, "cp": 16},
    {"tp": 2, "cp": 16},
    {"mbs": 2},
)
OPTIONS = (
    {},
    {"recompute_granularity": "selective", "recompute_modules": frozenset({"moe_act", "layernorm"})},
    {"recompute_granularity": "full", "recompute_modules": frozenset()},
    {"dispatcher": "allgather"},
    {"optimizer_offload_fraction": 0.5},
)


@pytest.mark.parametrize("model", ["deepseek-v3", "qwen3-30b-a3b"])
def test_shared_layer_bytes_change_no_estimate(model: str) -> None:
    shared = SharedLayerBytes(make_run(model).model)
    for _ in range(2):  # the second round finds every layer already shared
        for layout in LAYOUTS:
            for options in OPTIONS:
                run = with_options(make_run(model, **layout), **options)  # type: ignore[arg-type]
                args = (run.model, run.hardware, run.layout, run.options)
                assert estimate_memory(*args, shared=shared) == estimate_memory(*args)
    assert len(shared.layers) < len(LAYOUTS) * len(OPTIONS)  # PP and VPP share a token shape


def test_shared_layer_bytes_of_another_model_are_not_used() -> None:
    run, other = make_run("deepseek-v3"), make_run("qwen3-30b-a3b")
    shared = SharedLayerBytes(other.model)
    args = (run.model, run.hardware, run.layout, run.options)
    assert estimate_memory(*args, shared=shared) == estimate_memory(*args)
    assert not shared.layers


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("options", OPTIONS)
def test_chunk_bytes_kept_per_chunk_are_the_chunk_bytes(layout: dict[str, int], options: dict[str, object]) -> None:
    # chunk_activation_bytes keeps each chunk's bytes in the estimate's LayerCache; a repeat is the same.
    run = with_options(make_run("deepseek-v3", **layout), **options)  # type: ignore[arg-type]
    inputs = stage_inputs(run.model, run.hardware, run.layout, run.options)
    shape = token_shape(run.layout, inputs.options)
    for stage in staged_layout(run.model, run.layout).stages:
        for chunk in stage.chunks:
            fresh = stage_inputs(run.model, run.hardware, run.layout, run.options)
            assert chunk_activation_bytes(inputs, chunk, shape) == _chunk_activation_bytes(fresh, chunk, shape)
    assert inputs.known[2]
