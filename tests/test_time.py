"""Step-time model: the properties the issue names, and consistency with Bridge FLOPs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lcmoe.catalog import load_hardware
from lcmoe.estimate.flops import flops_per_token
from lcmoe.estimate.time import (
    ATTENTION_EFFICIENCY_MEASURED,
    COEFFICIENT_BOUNDS,
    TimeCoefficients,
    attention_efficiency_on_counted_flops,
    dense_fp8_gain,
    estimate_time,
    grouped_gemm_saturation,
    layer_host_seconds,
    shipped_time_coefficients,
    stage_time,
    time_amounts,
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


def test_dedup_dispatchers_send_one_copy_per_destination() -> None:
    """DeepEP / HybridEP send a token once per destination rank and once per remote NVLink
    domain; alltoall sends one row per (token, expert). Hand-computed for DeepSeek-V3 at EP32
    over 4 H100 nodes (node-limited routing: 4 of 8 groups of 32 experts, 2 groups per node) and
    for Qwen3-30B-A3B at EP8 inside one node (no groups)."""
    from math import comb

    from lcmoe.catalog import load_model
    from lcmoe.estimate.time import ep_link_shares

    dsv3 = load_model("deepseek-v3")
    k = dsv3.moe_router_topk
    # x of the 4 chosen groups on a given node: hypergeometric(8 groups, 2 on the node, 4 drawn);
    # the token misses the node when none of its 8 experts (among 128 eligible) lands there.
    miss = sum(comb(2, x) * comb(6, 4 - x) / comb(8, 4) * comb(128 - 32 * x, 8) / comb(128, 8) for x in range(3))
    local, remote = ep_link_shares(dsv3, 32, 1, 8, "deepep")
    assert remote * k == pytest.approx(3 * (1 - miss))
    assert remote * k < 8 * 24 / 32  # fewer NIC copies than alltoall's 6
    assert ep_link_shares(dsv3, 32, 1, 8, "alltoall") == pytest.approx((7 / 32, 24 / 32))

    qwen = load_model("qwen3-30b-a3b")
    local, remote = ep_link_shares(qwen, 8, 1, 8, "hybridep")
    assert remote == 0.0
    assert local * qwen.moe_router_topk == pytest.approx(7 * (1 - comb(112, 8) / comb(128, 8)))


def test_expert_launches_scale_with_local_experts_and_only_expert_graphs_capture_them() -> None:
    c = TimeCoefficients(layer_overhead_seconds=0.0, moe_layer_overhead_seconds=0.0, expert_host_seconds=1e-4)
    assert layer_host_seconds(frozenset(), True, c, local_experts=16) == pytest.approx(16e-4)
    # Router / preprocess graphs end before the experts run; a dense layer has none.
    assert layer_host_seconds(frozenset({"moe_router", "moe_preprocess"}), True, c, 16) == pytest.approx(16e-4)
    assert layer_host_seconds(frozenset(), False, c, 16) == 0.0
    saving = c.cuda_graph_overhead_saving
    assert layer_host_seconds(frozenset({"moe"}), True, c, 16) == pytest.approx(16e-4 * (1 - saving))
    # One graph replay per step: no host time left at all.
    assert layer_host_seconds(frozenset({"full_iteration"}), True, c, 16) == 0.0


def test_fp8_grouped_speedup_sets_the_expert_gemm_ratio_to_bf16() -> None:
    run = make_run()
    # At one small-expert half-size for both precisions, the ratio is the speedup itself.
    c = replace(shipped_time_coefficients("hopper"), fp8_grouped_speedup=1.25, grouped_gemm_half_size_bf16=0.0)
    bf16 = time_amounts(with_options(run, precision="bf16"))
    fp8 = time_amounts(with_options(run, precision="fp8-blockwise"))
    t_bf16 = stage_time(bf16, bf16.stages[0], c).expert_gemm
    t_fp8 = stage_time(fp8, fp8.stages[0], c).expert_gemm
    assert t_bf16 / t_fp8 == pytest.approx(1.25)


def test_bf16_experts_take_their_own_half_size() -> None:
    """grouped_gemm_half_size_bf16 rates BF16 experts (s / (s + s½_bf16)) and leaves FP8 ones alone."""
    run = make_run()
    base = shipped_time_coefficients("hopper")
    s = time_amounts(with_options(run, precision="bf16")).expert_gemm_size
    shared = replace(base, grouped_gemm_half_size_bf16=0.0)
    own = replace(base, grouped_gemm_half_size_bf16=base.grouped_gemm_half_size / 4)
    ratio = grouped_gemm_saturation(4096, own, s, bf16=True) / grouped_gemm_saturation(4096, shared, s, bf16=True)
    half = base.grouped_gemm_half_size
    assert ratio == pytest.approx((s + half) / (s + half / 4))
    assert grouped_gemm_saturation(4096, own, s) == grouped_gemm_saturation(4096, shared, s)


def test_dense_fp8_gain_is_the_dense_rate_ratio() -> None:
    # H100: FP8 peak 2x BF16's, so the gain is 2 * e_fp8 / e_bf16 (0.52 / 0.61 -> 1.70).
    fp8 = time_amounts(with_options(make_run(), precision="fp8-blockwise"))
    c = replace(TimeCoefficients(), gemm_efficiency_fp8=0.52, gemm_efficiency_bf16=0.61)
    assert fp8.gemm_peak / fp8.bf16_peak == pytest.approx(2.0, rel=0.01)
    assert dense_fp8_gain(fp8, c) == pytest.approx(fp8.gemm_peak / fp8.bf16_peak * 0.52 / 0.61)


def test_hopper_expert_fp8_speedup_is_its_dense_fp8_gain() -> None:
    # Hopper has no BF16 MoE row to fit the ratio from, so the fit ships its dense FP8 gain.
    c = shipped_time_coefficients("hopper")
    fp8 = time_amounts(with_options(make_run(), precision="fp8-blockwise"))
    low, high = COEFFICIENT_BOUNDS["fp8_grouped_speedup"]
    assert c.fp8_grouped_speedup == pytest.approx(min(high, max(low, dense_fp8_gain(fp8, c))), rel=1e-6)


def test_interleaved_pipeline_hides_p2p_behind_compute() -> None:
    # Bridge turns overlap_p2p_comm on with VPP > 1: the send/recv runs under the next chunk, and
    # only what outlasts the stage's compute shows; with VPP = 1 all of it does.
    c = shipped_time_coefficients("hopper")
    for bandwidth in (50e9, 1e7):
        net = load_hardware("h100", {"scaleout_bandwidth": bandwidth})
        for vpp in (1, 2):
            a = time_amounts(replace(make_run(pp=4, vpp=vpp, gbs=None), hardware=net))
            t = stage_time(a, a.stages[1], c)
            raw = vpp * a.stages[1].pp_bytes / (bandwidth * c.scaleout_efficiency)
            compute = t.dense_gemm + t.expert_gemm + t.attention + t.elementwise + t.recompute
            assert t.pp_comm == pytest.approx(raw if vpp == 1 else max(0.0, raw - compute))
