"""The step time fine-grained activation offloading adds: the offloaded inputs cross the host
link twice per microbatch (to the host in forward, back in backward), on their own CUDA streams
beside the compute (pipeline_parallel/fine_grained_activation_offload.py: ``d2h_stream`` /
``h2d_stream``, bulk_offload_group :1002-1026, bulk_reload_group :1036-1056)."""

from __future__ import annotations

from lcmoe.estimate.memory import activation_offload_saving, token_shape
from lcmoe.layout import PipelineStage
from lcmoe.run import RunConfig

# The share of the copy time that shows even when compute could hide it all. Not fitted (no
# measured run offloads activations): Megatron-Core's guide claims "nearly zero-overhead"
# offloading (docs user-guide/features/fine_grained_activation_offloading, 0.18-0.19), yet the
# main stream waits on each reload event before the layer's backward (wait_reload_event,
# fine_grained_activation_offload.py:390-392) and the copies share the PCIe switch with the
# NICs' GPUDirect traffic; 10% of the copy time is charged for both.
ACTIVATION_OFFLOAD_EXPOSED_SHARE = 0.1


def stage_offload_bytes(run: RunConfig, stage: PipelineStage) -> float:
    """Bytes one GPU of ``stage`` offloads per microbatch, each way: Σ over its layers (MTP
    layers included) of ``activation_offload_saving``, the bytes that also leave its memory."""
    options = run.options
    if not options.activation_offload_modules:
        return 0.0
    shape = token_shape(run.layout, options)
    model = run.model
    total = sum(count * activation_offload_saving(model, first, shape, options) for first, count in stage.layer_groups)
    if stage.mtp_layers:
        total += stage.mtp_layers * activation_offload_saving(model, model.mtp_layer, shape, options)
    return total


def activation_offload_seconds(offload_bytes: float, host_link_bandwidth: float, compute_seconds: float) -> float:
    """Exposed seconds per microbatch: copy = 2·B / host-link bandwidth (B to the host and back,
    one way each at ``hardware.host_link_bandwidth``, the GPU↔host datasheet rate); what the
    microbatch's compute cannot cover shows in full, and at least ACTIVATION_OFFLOAD_EXPOSED_SHARE
    of the copy: max(share·copy, copy − compute)."""
    if offload_bytes <= 0:
        return 0.0
    copy = 2.0 * offload_bytes / host_link_bandwidth
    return max(ACTIVATION_OFFLOAD_EXPOSED_SHARE * copy, copy - compute_seconds)


def activation_offload_doubt(offload_bytes: float, host_link_bandwidth: float, compute_seconds: float) -> float:
    """How far ``activation_offload_seconds`` could be off, no measured run pricing it: the true
    exposure lies between what compute cannot cover, max(0, copy − compute), and the whole copy;
    the larger distance from the charge to either end."""
    if offload_bytes <= 0:
        return 0.0
    copy = 2.0 * offload_bytes / host_link_bandwidth
    charged = activation_offload_seconds(offload_bytes, host_link_bandwidth, compute_seconds)
    return max(charged - max(0.0, copy - compute_seconds), copy - charged)
