"""Measured mechanisms of the step-time model that replaced fitted coefficients."""

from __future__ import annotations

from pathlib import Path

import pytest

from lcmoe.estimate.time import DISPATCH_SM_SHARE, TimeCoefficients, ep_exposed_seconds


def test_ep_without_overlap_is_all_exposed() -> None:
    assert ep_exposed_seconds(2.0e-3, overlap=False, dispatcher="hybridep") == 2.0e-3


def test_ep_overlap_costs_the_dispatch_sms() -> None:
    """With a2a overlap the transfer is hidden and the compute beside it loses the SMs the
    dispatch kernels hold: HybridEP at 32 of 148 SMs → 2 ms of dispatch costs 0.43 ms."""
    assert ep_exposed_seconds(2.0e-3, overlap=True, dispatcher="hybridep") == pytest.approx(2.0e-3 * 32 / 148)
    assert ep_exposed_seconds(2.0e-3, overlap=True, dispatcher="deepep") == pytest.approx(2.0e-3 * 20 / 132)


def test_unknown_dispatcher_takes_nccl_share() -> None:
    assert ep_exposed_seconds(1.0, overlap=True, dispatcher="other") == pytest.approx(DISPATCH_SM_SHARE["alltoall"])


def test_measured_ep_and_permute_defaults() -> None:
    """EP link efficiency priors from kernels-and-links.md §8 and Megatron's 8 permute passes."""
    c = TimeCoefficients()
    assert (c.ep_comm_efficiency, c.ep_network_efficiency, c.moe_permute_passes) == (0.75, 0.9, 8.0)


def test_gdn_recurrence_runs_at_its_kernel_rate() -> None:
    """Qwen3-Next: 32 value heads of 128 × 128 state → 4096 tokens × 32 = 131072 token·heads,
    at GB200's 6.0 ns (FLA chunk_gated_delta_rule fwd + bwd) = 0.79 ms per layer."""
    from lcmoe.catalog import load_model
    from lcmoe.estimate.time import gdn_kernel_seconds, gdn_token_heads

    model = load_model("qwen3-next-80b-a3b")
    heads = gdn_token_heads(4096, model)
    assert heads == 4096 * 32
    assert gdn_kernel_seconds(heads, "blackwell") == pytest.approx(4096 * 32 * 6.0e-9)
    assert gdn_kernel_seconds(heads, "hopper") > gdn_kernel_seconds(heads, "blackwell")


def test_gdn_cp_adds_all_to_all() -> None:
    """GDN under CP exchanges the in_proj output and the mixer output (Megatron gdn.py a2a):
    CP 2 costs more CP communication than none."""
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.estimate.time import estimate_time
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.workload import TrainingOptions

    model, gpu = load_model("qwen3-next-80b-a3b"), load_hardware("h100")
    options = TrainingOptions(seq_len=16384, precision="bf16", recompute_granularity="full")
    run = RunConfig(model, gpu, build_layout(model, 16, cp=2, ep=8), options)
    assert estimate_time(run).breakdown["cp_comm"] > 0


def test_nvfp4_experts_gain_what_dense_nvfp4_gains_over_mxfp8() -> None:
    """GB200, the coefficients as shipped: NVFP4 expert GEMMs run at the FP8-class expert rate
    (BF16 peak × fp8_grouped_speedup) × (10 PF · e_fp4) / (5 PF · e_mxfp8), not at the raw FP4
    peak (4× BF16)."""
    from dataclasses import replace

    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.estimate.time import (
        RunAmounts,
        grouped_peak_flops_per_second,
        shipped_time_coefficients,
        time_amounts,
    )
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.workload import TrainingOptions

    model, gpu = load_model("qwen3-30b-a3b"), load_hardware("gb200")
    c = shipped_time_coefficients("blackwell")
    layout = build_layout(model, 8, ep=8, mbs=1, gbs=64)

    def amounts(precision: str) -> RunAmounts:
        return time_amounts(RunConfig(model, gpu, layout, TrainingOptions(seq_len=4096, precision=precision)))

    mxfp8 = grouped_peak_flops_per_second(amounts("mxfp8"), c)
    nvfp4 = grouped_peak_flops_per_second(amounts("nvfp4"), c)
    assert mxfp8 == pytest.approx(2.5e15 * c.fp8_grouped_speedup)
    assert nvfp4 / mxfp8 == pytest.approx(10.0e15 * c.gemm_efficiency_fp4 / (5.0e15 * c.gemm_efficiency_mxfp8))
    assert nvfp4 < 0.5 * 10.0e15
    # A GPU without FP8 tensor cores keeps the raw peak (no FP8-class rate to start from).
    assert grouped_peak_flops_per_second(replace(amounts("nvfp4"), fp8_peak_flops_per_second=0.0), c) == 10.0e15


def test_sliding_window_attention_saturates_on_its_window() -> None:
    """GPT-OSS (window (127, 0) on every other layer: W = 128 keys), GB200 BF16 at 4K: the windowed layers' attention
    rate is the full layers' × (128 / (128 + L½)) / (c / (c + L½)) — the kernel saturates on the
    window's keys (cuDNN SWA-128 runs at 6–8% of peak, kernel-rates-by-shape.md §3b), so the
    window attention costs more per FLOP than the full attention; the explain terms split them."""
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.estimate.time import (
        attention_saturation,
        explain_time,
        shipped_time_coefficients,
        stage_rates,
        time_amounts,
        window_attention_saturation,
    )
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.workload import TrainingOptions

    model, gpu = load_model("gpt-oss-120b"), load_hardware("gb200")
    c = shipped_time_coefficients("blackwell")
    run = RunConfig(model, gpu, build_layout(model, 64, ep=8, mbs=1, gbs=512), TrainingOptions(seq_len=4096))
    a = time_amounts(run)
    assert a.attention_window == model.window_tokens == 128
    r = stage_rates(a, c)
    full = attention_saturation(a.attention_chunk, c)
    assert r.window_attention_flops_per_second / r.attention_flops_per_second == pytest.approx(
        (128 / (128 + c.attention_half_chunk)) / full
    )
    assert r.window_attention_flops_per_second / 2.5e15 < 0.08  # near the measured 6–8% of peak
    # No window: the full layers' saturation; a window longer than the chunk: the chunk's.
    assert window_attention_saturation(4096, 0, c) == full
    assert window_attention_saturation(4096, 8192, c) == full
    names = {t.name: t for t in explain_time(run).terms}
    window = names["sliding-window attention core"]
    assert window.seconds == pytest.approx(window.amount / window.rate)
    assert window.rate == pytest.approx(r.window_attention_flops_per_second)


def test_host_adam_rate_reproduces_the_measured_offload_slope(reference: Path) -> None:
    """TimeCoefficients.host_adam_params_per_second comes from the slope of NVIDIA's optimizer-
    offload series (Qwen3-30B-A3B, 16 H100, 25 → 100%): the shipped coefficients reproduce that
    slope, the step time added per share offloaded, within 5%."""
    from benchmarks.points import perf_recipes_beside, point_config
    from benchmarks.published import read_rows

    from lcmoe.estimate.time import combine, shipped_time_coefficients, time_amounts
    from lcmoe.run import RunConfig

    points = str(reference / "memory_points.csv")
    recipes = perf_recipes_beside(points)
    series: dict[float, tuple[float, float]] = {}
    for row in read_rows(points):
        detail = row.get("config_detail", "")
        if not detail.startswith("optimizer_offload_") or detail.endswith("overlap"):
            continue
        config = point_config(row, recipes)
        assert not isinstance(config, str)
        run = RunConfig(*config)
        predicted = combine(time_amounts(run), shipped_time_coefficients("hopper")).step_seconds
        series[run.options.optimizer_offload_fraction] = (float(row["step_time_ms"]) / 1e3, predicted)
    assert sorted(series) == [0.25, 0.5, 0.75, 1.0]
    measured_slope = series[1.0][0] - series[0.25][0]
    predicted_slope = series[1.0][1] - series[0.25][1]
    assert predicted_slope == pytest.approx(measured_slope, rel=0.05)
