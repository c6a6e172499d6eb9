"""Measured mechanisms of the step-time model that replaced fitted coefficients."""

from __future__ import annotations

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
