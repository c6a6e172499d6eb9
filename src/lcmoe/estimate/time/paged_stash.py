"""The step time the MoE paged stash adds: its page copies, the host pages' spill, and the re-run
of a step whose budget or pages overflow. What a rank capacity factor removes, the device-to-host
read of the dispatched token count in every HybridEP layer (token_dispatcher.py:1163-1169, "CPU
sync"), is not charged to dropless HybridEP in the first place (``time.host``,
HOST_SYNCING_DISPATCHERS), so sync-free experts change no other term.

Megatron-Core 0.19.2 ``transformer/moe/paged_stash.py`` (``ps``): each MoE layer's grouped-MLP
tensors are copied into the pages on the pack stream after its forward (``stash_paged_tensors``,
ps:473-497; ``paged_stash_copy_kernel`` moves the received tokens only, ps:193-244) and back into a
fresh tensor before its backward (``reload_paged_tensors``, ps:511-544); the main stream waits for
both (ps:499-509, 366-374). Pages that do not fit the GPU buffer go to the pinned host buffer
(ps:72-79, the same kernel writing host memory). ``PagedStashRunner`` (ps:1149-1239) all-reduces
the overflow flags after every step and, on any, re-runs the forward/backward once in dropless
synced mode without the stash (ps:1087-1147).

Not fitted: no measured run uses the paged stash (the reference data holds none), so each
charge is a stated assumption, and ``unmeasured_seconds`` tells the time band how far off each
could be.
"""

from __future__ import annotations

from lcmoe.estimate.memory import token_shape
from lcmoe.estimate.memory.paged_stash import balanced_dispatched_tokens, expert_bytes_per_token, stash_factor
from lcmoe.layout import PipelineStage
from lcmoe.run import RunConfig

# HBM passes of one stashed byte: read and written into the pages after forward, read and written
# back before backward.
STASH_HBM_PASSES = 4
# The share of steps that overflow the budget or the pages and re-run. Unmeasurable from the
# reference data (no run logs the PagedStashRunner's "rerunning" lines) and a property of the
# router's load over the run, not of the layout: an ASSUMPTION, 1 step in 100, kept for the
# expected cost and named in the estimate; the time band widens by the whole re-run share
# beside it (band.unmeasured_pct).
ASSUMED_OVERFLOW_RATE = 0.01


def stage_stash_amounts(run: RunConfig, stage: PipelineStage) -> tuple[float, float]:
    """(bytes one GPU of ``stage`` stashes per microbatch, the part of them that spills to the host
    pages): Σ over its MoE layers (MTP layers included) of the received tokens × the expert bytes
    per token (``memory.paged_stash.expert_bytes_per_token``); the received tokens are the
    busiest rank's, ``moe_token_imbalance`` × the balanced T·k, and what exceeds the GPU pages'
    share (``stash_factor`` of the CUDA factor) spills while the host pages hold it."""
    options, model = run.options, run.model
    if not options.moe_paged_stash or not model.is_moe:
        return 0.0, 0.0
    moe_layers = sum(count for first, count in stage.layer_groups if model.is_moe_layer(first))
    moe_layers += stage.mtp_layers if model.is_moe_layer(model.mtp_layer) else 0
    shape = token_shape(run.layout, options)
    per_token = expert_bytes_per_token(model, shape.stored_gemm_input, shape.etp, options)
    balanced = balanced_dispatched_tokens(model, shape.tokens, shape.sp, shape.etp)
    imbalance = options.moe_token_imbalance
    gpu = stash_factor(options.moe_paged_stash_buffer_size_factor_cuda, imbalance)
    host = stash_factor(options.moe_paged_stash_buffer_size_factor_cpu, imbalance)
    spilled = min(max(0.0, imbalance - gpu), host)
    return moe_layers * imbalance * balanced * per_token, moe_layers * spilled * balanced * per_token


def paged_stash_seconds(stash_bytes: float, spill_bytes: float, hbm_bandwidth: float, host_link: float) -> float:
    """Seconds per microbatch, charged in full: STASH_HBM_PASSES·(B − S)/HBM + 2·S/host link (B
    stashed, S of it through the host pages, out and back). An upper bound: the copies run on the
    pack stream beside the compute, but as kernels of up to 2048 blocks each (ps:209-212) that
    take SMs from it, and the main stream waits for them at every MoE layer."""
    if stash_bytes <= 0:
        return 0.0
    return STASH_HBM_PASSES * (stash_bytes - spill_bytes) / hbm_bandwidth + 2.0 * spill_bytes / host_link


def rerun_seconds(forward_backward_seconds: float) -> float:
    """The expected cost of the re-run: ASSUMED_OVERFLOW_RATE × one more forward/backward of every
    microbatch (the optimizer steps once; the fallback runs without the full-iteration graph and
    with the HybridEP sync, which lcmoe prices no differently, ``time.host``)."""
    return ASSUMED_OVERFLOW_RATE * forward_backward_seconds
