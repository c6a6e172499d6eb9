"""Step-time model: the properties the issue names, and consistency with Bridge FLOPs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lcmoe.catalog import load_hardware
from lcmoe.estimate.flops import flops_per_token
from lcmoe.estimate.time import (
    ATTENTION_EFFICIENCY_MEASURED,
    COEFFICIENT_BOUNDS,
    attention_efficiency_on_counted_flops,
    estimate_time,
    shipped_time_coefficients,
)
from tests.helpers import make_run, with_layout, with_options


def test_tflops_is_bridge_flops_over_step_time() -> None:
    run = make_run()
    t = estimate_time(run)
    tokens = run.layout.gbs * run.options.seq_len
    flops = flops_per_token(run.model, run.options.seq_len, tp=run.layout.tp).total * tokens
    assert t.model_tflops_per_gpu == pytest.approx(flops / t.step_seconds / run.layout.world_size / 1e12)
    assert t.mfu == pytest.approx(t.model_tflops_per_gpu * 1e12 / run.hardware.peak("bf16"))
    assert sum(t.breakdown.values()) == pytest.approx(t.step_seconds)


def test_more_exposed_communication_never_speeds_a_step() -> None:
    run = make_run()
    slow_net = replace(run, hardware=load_hardware("h100", {"scaleout_bandwidth": 12.5e9}))
    assert estimate_time(slow_net).step_seconds >= estimate_time(run).step_seconds


def test_larger_bubble_never_speeds_a_step() -> None:
    # Fewer microbatches per step → larger bubble share → lower throughput per token.
    run = make_run(pp=8, vpp=1, gbs=None)
    few = with_layout(run, gbs=run.layout.dp * 8)
    many = with_layout(run, gbs=run.layout.dp * 64)
    assert estimate_time(few).tokens_per_sec_per_gpu <= estimate_time(many).tokens_per_sec_per_gpu


@pytest.mark.parametrize(
    "granularity,modules",
    [
        ("selective", frozenset({"moe_act"})),
        ("selective", frozenset({"mla_up_proj", "layernorm", "moe"})),
        ("full", frozenset()),
    ],
)
def test_recompute_never_speeds_a_step(granularity: str, modules: frozenset[str]) -> None:
    run = make_run()
    recomputed = with_options(run, recompute_granularity=granularity, recompute_modules=modules)
    assert estimate_time(recomputed).step_seconds >= estimate_time(run).step_seconds


def test_doubling_sequence_raises_attention_time_super_linearly() -> None:
    run = make_run(seq_len=32768, cp=8, gpus=256)
    doubled = with_options(run, seq_len=65536)
    a = estimate_time(run).breakdown["attention"]
    b = estimate_time(doubled).breakdown["attention"]
    assert b > 2 * a


def test_attention_efficiency_combines_forward_and_backward_on_bridges_count() -> None:
    # Counted 3F; the kernel spends F/0.65 + 2.5F/0.57 (hand-checked: 3 / 5.925 = 0.506).
    assert attention_efficiency_on_counted_flops(0.65, 0.57) == pytest.approx(3 / (1 / 0.65 + 2.5 / 0.57))
    assert attention_efficiency_on_counted_flops(0.65, 0.57) == pytest.approx(0.5063, abs=1e-3)
    ceiling = COEFFICIENT_BOUNDS["attention_efficiency"][1]
    for family, (low, high) in ATTENTION_EFFICIENCY_MEASURED.items():
        assert 0 < low < high <= ceiling, family
        shipped = shipped_time_coefficients(family).attention_efficiency
        assert low - 1e-6 <= shipped <= high + 1e-6, family
