"""What the memory estimate reports: the peak of one pipeline stage by component (StageMemory)
and of every stage (MemoryEstimate)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of the worst GPU of one pipeline stage, by component (bytes)."""

    stage: int
    layers: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits_loss: float
    transient: float
    workspace: float
    peak_allocated: float
    fragmentation: float
    cuda_context: float
    nccl_buffers: float
    cuda_graphs: float
    dispatcher_buffers: float
    peak_reserved: float
    optimizer_host: float
    inflight_microbatches: int
    # What is live at the peak moment (components() sums exactly to peak_reserved): the loss
    # stage peaks on the logits or on a layer's backward, not both; in first-step mode the Adam
    # moments are not allocated yet during the first backward; DDP/optimizer padding is its own
    # "state_overhead" term.
    state_overhead: float = 0.0
    weight_copies: float = 0.0
    optimizer_at_peak: float | None = None
    activations_at_peak: float | None = None
    logits_at_peak: float | None = None
    transient_at_peak: float | None = None
    # Fine-grained activation offloading's pinned host copies (layers.offload_host_bytes).
    activations_host: float = 0.0

    def components(self) -> dict[str, float]:
        """Bytes by component at the stage's peak; the values sum to ``peak_reserved``."""

        def at_peak(value: float | None, default: float) -> float:
            return default if value is None else value

        return {
            "weights": self.weights,
            "weight_copies": self.weight_copies,
            "gradients": self.gradients,
            "optimizer": at_peak(self.optimizer_at_peak, self.optimizer),
            "state_overhead": self.state_overhead,
            "activations": at_peak(self.activations_at_peak, self.activations),
            "logits_loss": at_peak(self.logits_at_peak, self.logits_loss),
            "transient": at_peak(self.transient_at_peak, self.transient),
            "workspace": self.workspace,
            "fragmentation": self.fragmentation,
            "cuda_context": self.cuda_context,
            "nccl_buffers": self.nccl_buffers,
            "cuda_graphs": self.cuda_graphs,
            "dispatcher_buffers": self.dispatcher_buffers,
        }


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    stages: tuple[StageMemory, ...]
    capacity_bytes: float
    host_capacity_bytes: float
    error_band: float = 0.0

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak_reserved)

    @property
    def peak_allocated_bytes(self) -> float:
        return max(s.peak_allocated for s in self.stages)

    @property
    def peak_reserved_bytes(self) -> float:
        return max(s.peak_reserved for s in self.stages)

    @property
    def peak_torch_reserved_bytes(self) -> float:
        """What ``torch.cuda.max_memory_reserved`` (Bridge's ``mem-max-reserved``) reports: the
        caching allocator's segments, allocated plus fragmentation. The CUDA context, NCCL and
        DeepEP/HybridEP buffers are allocated outside PyTorch and appear only in nvidia-smi."""
        return max(s.peak_allocated + s.fragmentation for s in self.stages)

    @property
    def host_bytes_per_gpu(self) -> float:
        return max(s.optimizer_host + s.activations_host for s in self.stages)

    def fits(self, margin: float = 0.0) -> bool:
        """Reserved peak of every stage within (1 − margin) of the GPU's memory, host within its DRAM."""
        return (
            self.peak_reserved_bytes <= (1.0 - margin) * self.capacity_bytes
            and self.host_bytes_per_gpu <= self.host_capacity_bytes
        )

    @property
    def oom_risk(self) -> bool:
        """Predicted to fit, but by less than the estimator's own error: the reserved peak raised by
        ``error_band`` (the held-out 90th-percentile error) would not fit. Such a verdict cannot
        be trusted either way; every documented OOM that lcmoe predicts to fit within 5% of
        capacity in memory_points.csv is one (benchmarks/memory_accuracy.py)."""
        return self.fits() and self.peak_reserved_bytes * (1.0 + self.error_band) > self.capacity_bytes

    def as_dict(self) -> dict[str, object]:
        worst = self.worst
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_torch_reserved_bytes": self.peak_torch_reserved_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.capacity_bytes - self.peak_reserved_bytes,
            "fits": self.fits(),
            "oom_risk": self.oom_risk,
            "error_band_pct": 100 * self.error_band,
            "worst_stage": worst.stage,
            "host_bytes_per_gpu": self.host_bytes_per_gpu,
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "inflight_microbatches": s.inflight_microbatches,
                    "peak_allocated_bytes": s.peak_allocated,
                    "peak_reserved_bytes": s.peak_reserved,
                    "components": s.components(),
                }
                for s in self.stages
            ],
        }
