"""The step: the slowest stage's microbatch time × (microbatches + pipeline bubble), plus exposed
data-parallel gradient traffic and the optimizer step."""

from __future__ import annotations

from dataclasses import dataclass, field

from lcmoe.estimate.memory import StagedLayout
from lcmoe.estimate.time.amounts import RunAmounts, StageAmounts, time_amounts
from lcmoe.estimate.time.coefficients import TimeCoefficients, shipped_time_coefficients
from lcmoe.estimate.time.communication import link_bandwidth
from lcmoe.estimate.time.muon_step import stage_optimizer_seconds
from lcmoe.estimate.time.offload import activation_offload_doubt, activation_offload_seconds
from lcmoe.estimate.time.paged_stash import paged_stash_seconds, rerun_seconds
from lcmoe.estimate.time.stage import (
    LaunchFreeSeconds,
    StageRates,
    StageTime,
    stage_rates,
    stage_time,
    stage_time_key,
)
from lcmoe.run import RunConfig


# ----- the step ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TimeEstimate:
    step_seconds: float
    tokens_per_sec_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    breakdown: dict[str, float]
    critical_stage: int
    # Seconds by which the terms no measured run prices could be off (band.widened): the
    # activation-offload exposure's room either side of its assumed share, the paged stash's
    # copies (charged in full) and its assumed re-run.
    unmeasured_seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "step_seconds": self.step_seconds,
            "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "breakdown": self.breakdown,
            "critical_stage": self.critical_stage,
        }


@dataclass(slots=True)
class SharedPricing:
    """What ``combine`` computes alike for the variants of one set of amounts: amounts made from
    one another by ``relaunched_amounts`` (the same ``stages`` tuple; only the EP link shares,
    dispatcher, CUDA-graph scope and EP overlap differ), priced at the same coefficients. Kept by
    the planner for one such set (``plan.fitting.priced_variants``); the values are those
    ``combine`` computes without it:

    ``rates``: ``stage_rates`` per dispatcher (the only one of those fields it reads);
    ``bases``: each layer group's ``launch_free_seconds`` by the group's id (the groups live in
    ``stages``, held here, so an id names one group); ``firsts``: for each stage, the index of the
    first stage with its ``stage_time_key``; ``tail``: the exposed DP and optimizer seconds
    (they read none of those fields)."""

    stages: tuple[StageAmounts, ...]
    rates: dict[str, StageRates] = field(default_factory=dict)
    bases: dict[int, LaunchFreeSeconds] = field(default_factory=dict)
    firsts: tuple[int, ...] = ()
    tail: tuple[float, float] | None = None


def shared_pricing(a: RunAmounts) -> SharedPricing:
    """A fresh ``SharedPricing`` for ``a`` and the amounts relaunched from it."""
    seen: dict[tuple[object, ...], int] = {}
    firsts = tuple(seen.setdefault(stage_time_key(stage), index) for index, stage in enumerate(a.stages))
    return SharedPricing(a.stages, firsts=firsts)


def step_tail(a: RunAmounts, c: TimeCoefficients) -> tuple[float, float]:
    """(exposed DP gradient seconds, optimizer-step seconds) of the step: the largest stage's."""
    dp_bw = link_bandwidth(a, a.dp_span, c)
    dp = max(c.dp_exposed_fraction * (s.dp_bytes + s.fsdp_bytes) / dp_bw for s in a.stages)
    optimizer = max(stage_optimizer_seconds(a, s, c) for s in a.stages)
    return dp, optimizer


def stage_times(a: RunAmounts, c: TimeCoefficients, shared: SharedPricing | None = None) -> list[StageTime]:
    """Each stage's microbatch time; identical stages (``stage_time_key``) are timed once, at
    rates built once (``shared``: see ``combine``)."""
    if shared is None:
        rates = stage_rates(a, c)
        timed: dict[tuple[object, ...], StageTime] = {}
        per_stage = []
        for stage in a.stages:
            key = stage_time_key(stage)
            known = timed.get(key)
            if known is None:
                known = timed[key] = stage_time(a, stage, c, rates)
            per_stage.append(known)
        return per_stage
    if shared.stages is not a.stages:
        raise ValueError("SharedPricing serves the amounts relaunched from one set of stages")
    rates = shared.rates.get(a.dispatcher) or shared.rates.setdefault(a.dispatcher, stage_rates(a, c))
    out: list[StageTime] = []
    for index, (stage, first) in enumerate(zip(a.stages, shared.firsts, strict=True)):
        out.append(out[first] if first < index else stage_time(a, stage, c, rates, shared.bases))
    return out


def combine(a: RunAmounts, c: TimeCoefficients, shared: SharedPricing | None = None) -> TimeEstimate:
    """Step time from amounts and rates: (M + bubble) × slowest stage + exposed DP + optimizer.
    Identical stages (``stage_time_key``) are timed once, at rates built once. ``shared``: what a
    caller pricing variants of one set of amounts keeps between them (``SharedPricing``; the
    same estimate as without it)."""
    per_stage = stage_times(a, c, shared)
    critical = max(range(len(per_stage)), key=lambda i: per_stage[i].total)
    microbatch = per_stage[critical]
    bubble_factor = (a.pp - 1) / a.vpp if a.pp > 1 else 0.0
    if shared is None:
        dp, optimizer = step_tail(a, c)
    else:
        if shared.tail is None:
            shared.tail = step_tail(a, c)
        dp, optimizer = shared.tail
    bubble = microbatch.total * bubble_factor
    offload, offload_doubt = activation_offload_step_seconds(a, per_stage)
    stash, rerun = paged_stash_step_seconds(a, microbatch.total * a.num_microbatches + bubble)
    step = microbatch.total * a.num_microbatches + bubble + dp + optimizer + offload + stash + rerun
    tflops = a.model_flops_per_step / step / a.world_size / 1e12
    breakdown = microbatch.as_dict(a.num_microbatches)
    breakdown.update(pipeline_bubble=bubble, dp_comm=dp, optimizer=optimizer)
    if offload:
        breakdown["activation_offload"] = offload
    if stash:
        breakdown.update(paged_stash=stash, paged_stash_rerun=rerun)
    return TimeEstimate(
        step_seconds=step,
        tokens_per_sec_per_gpu=a.tokens_per_step / step / a.world_size,
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / a.bf16_peak_flops_per_second,
        breakdown=breakdown,
        critical_stage=a.stages[critical].rank,
        unmeasured_seconds=offload_doubt + stash + rerun,
    )


def activation_offload_step_seconds(a: RunAmounts, per_stage: list[StageTime]) -> tuple[float, float]:
    """(M × the slowest stage's exposed host-link seconds per microbatch of fine-grained
    activation offloading, ``offload.activation_offload_seconds`` against that stage's compute:
    GEMMs, attention, elementwise and recompute; M × how far that could be off,
    ``offload.activation_offload_doubt``); (0, 0) without offloading."""
    worst, doubt = 0.0, 0.0
    for stage, timed in zip(a.stages, per_stage, strict=True):
        if stage.activation_offload_bytes:
            compute = timed.dense_gemm + timed.expert_gemm + timed.attention + timed.elementwise + timed.recompute
            seconds = activation_offload_seconds(stage.activation_offload_bytes, a.host_link_bytes_per_second, compute)
            if seconds > worst:
                worst = seconds
                doubt = activation_offload_doubt(stage.activation_offload_bytes, a.host_link_bytes_per_second, compute)
    return worst * a.num_microbatches, doubt * a.num_microbatches


def paged_stash_step_seconds(a: RunAmounts, forward_backward: float) -> tuple[float, float]:
    """(M × the slowest stage's page-copy seconds per microbatch, the expected re-run seconds) of
    the MoE paged stash (``paged_stash.paged_stash_seconds``, ``rerun_seconds`` of the step's
    forward/backward ``forward_backward``); (0, 0) without it."""
    worst = 0.0
    for stage in a.stages:
        if stage.paged_stash_bytes:
            seconds = paged_stash_seconds(
                stage.paged_stash_bytes,
                stage.paged_stash_spill_bytes,
                a.hbm_bytes_per_second,
                a.host_link_bytes_per_second,
            )
            worst = max(worst, seconds)
    if not worst:
        return 0.0, 0.0
    stash = worst * a.num_microbatches
    return stash, rerun_seconds(forward_backward + stash)


def estimate_time(
    run: RunConfig, coefficients: TimeCoefficients | None = None, *, staged: StagedLayout | None = None
) -> TimeEstimate:
    """Step time of ``run`` with the shipped (or given) coefficients (``staged``: see
    ``time_amounts``)."""
    c = coefficients or shipped_time_coefficients(run.hardware.architecture)
    if run.options.dynamic_context_parallel:  # documents regrouped per length: estimate.dynamic_cp
        from lcmoe.estimate.dynamic_cp import dynamic_cp_time

        return dynamic_cp_time(run, c)
    return combine(time_amounts(run, staged), c)
