"""The optimizer step's seconds on one stage (``stage_optimizer_seconds``), and Muon's part of it
(amounts: ``estimate.muon``): Newton-Schulz GEMMs at the BF16 GEMM rate, its TP traffic, and the
layer-wise optimizer's exposed DP traffic."""

from __future__ import annotations

from lcmoe.estimate.muon import muon_step_seconds
from lcmoe.estimate.time.amounts import RunAmounts, StageAmounts
from lcmoe.estimate.time.coefficients import TimeCoefficients
from lcmoe.estimate.time.communication import link_bandwidth


def stage_muon_seconds(a: RunAmounts, s: StageAmounts, c: TimeCoefficients) -> tuple[float, float, float]:
    """(NS compute, NS TP traffic, exposed DP traffic) seconds of stage ``s``'s Muon step
    (``estimate.muon.muon_step_seconds``): the NS GEMMs run at bf16 peak · gemm_efficiency_bf16
    (X is BF16 under muon_fp32_matmul_prec="medium"), TP traffic over the TP group's link, DP
    traffic over the DP group's."""
    if s.muon is None:
        return 0.0, 0.0, 0.0
    return muon_step_seconds(
        s.muon,
        gemm_flops_per_second=a.bf16_peak_flops_per_second * c.gemm_efficiency_bf16,
        tp_bytes_per_second=link_bandwidth(a, a.tp_span, c),
        dp_bytes_per_second=link_bandwidth(a, a.dp_span, c),
        dp_exposed_fraction=c.dp_exposed_fraction,
    )


def stage_muon_total(a: RunAmounts, s: StageAmounts, c: TimeCoefficients) -> float:
    """The three ``stage_muon_seconds`` added: what the step waits for after the last backward."""
    return sum(stage_muon_seconds(a, s, c))


def stage_optimizer_seconds(a: RunAmounts, s: StageAmounts, c: TimeCoefficients) -> float:
    """Stage ``s``'s optimizer step: the GPU optimizer's HBM pass (optimizer_gpu_bytes / HBM
    B/s), host Adam (optimizer_host_params / host_adam_params_per_second), the host-link copies
    (optimizer_host_bytes / host-link B/s) and Muon's step (``stage_muon_total``, 0 under Adam)."""
    return (
        s.optimizer_gpu_bytes / a.hbm_bytes_per_second
        + s.optimizer_host_params / c.host_adam_params_per_second
        + s.optimizer_host_bytes / a.host_link_bytes_per_second
        + stage_muon_total(a, s, c)
    )
