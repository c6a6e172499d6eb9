"""The fitted memory coefficients (MemoryCoefficients) and loading the shipped ones."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources

import yaml

from lcmoe.errors import LcmoeError

COEFFICIENTS_FILE = "memory_coefficients.yaml"


# Priors of the reserved-memory terms (what reserved adds to allocated). None is constrained by
# the fit, whose target is peak allocated (megatron_golden.csv), so these move the reserved peak
# only; the shipped yaml overrides a prior when fit_memory.py writes the field.
# - Fragmentation with ``expandable_segments`` (reserved / allocated − 1): an unsourced prior
#   used only when memory_points.csv publishes no allocated/reserved pair of one run;
#   fit_memory.py ``fragmentation_from_points`` replaces it with their median (0.0397 shipped).
FRAGMENTATION_PRIOR = 0.045
# - Fragmentation without expandable segments: an unsourced prior. The allocated/reserved pairs
#   in memory_points.csv are Bridge recipes, which set ``expandable_segments:True``
#   (megatron-bridge-facts.md §6), and the facts record only that it fixed fragmentation OOMs.
#   A run measuring both without it would replace this.
FRAGMENTATION_NO_EXPANDABLE_PRIOR = 0.36
# - The CUDA context (driver, cuBLAS/cuDNN handles, loaded kernels) and NCCL's communicator
#   buffers, allocated outside PyTorch: unsourced priors. The reserved peaks in
#   /work/shared/reference are PyTorch's (``mem-max-reserved``), which exclude both, so no row
#   constrains them. NCCL_BUFFSIZE is 4 MiB per channel and peer (NCCL docs, env.html), so the
#   true total scales with communicators, peers and channels; 0.5 GiB is a flat prior of that
#   order, not derived.
CUDA_CONTEXT_PRIOR_BYTES = 0.55 * 1024**3
NCCL_BUFFER_PRIOR_BYTES = 0.5 * 1024**3


@dataclass(frozen=True, slots=True)
class MemoryCoefficients:
    """Fitted multipliers (dimensionless unless stated) with their fit provenance.

    ``transient_layer_scale`` and ``moe_dispatch_scale`` stay at their physical value 1: the
    measured rank (loss stage) peaks at the loss, so no data constrains them (fit_memory.py)."""

    activation_scale: float = 1.0
    allgather_moe_scale: float = 1.0
    transient_layer_scale: float = 1.0
    logits_scale: float = 1.0
    moe_dispatch_scale: float = 1.0
    workspace_bytes: float = 0.0
    state_overhead_fraction: float = 0.0
    fragmentation_fraction: float = FRAGMENTATION_PRIOR
    fragmentation_fraction_no_expandable: float = FRAGMENTATION_NO_EXPANDABLE_PRIOR
    cuda_context_bytes: float = CUDA_CONTEXT_PRIOR_BYTES
    nccl_buffer_bytes: float = NCCL_BUFFER_PRIOR_BYTES
    fit: dict[str, object] = field(default_factory=dict)

    @property
    def error_band(self) -> float:
        """How far a prediction may be from the measured peak: the 90th-percentile absolute error
        on the rows each fold did not see (``fit.grouped_5fold_cv.p90_abs_pct_err`` / 100, written
        by fit_memory.py); 0 when the coefficients carry no fit record."""
        cv = self.fit.get("grouped_5fold_cv")
        p90 = cv.get("p90_abs_pct_err") if isinstance(cv, dict) else None
        return float(p90) / 100 if isinstance(p90, int | float) else 0.0


@functools.cache
def shipped_coefficients() -> MemoryCoefficients:
    """The coefficients shipped with the package (fit on shared/reference by fit_memory.py). A
    missing file is an installation fault, not a reason to predict with unfitted priors."""
    path = resources.files("lcmoe.data").joinpath(COEFFICIENTS_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise LcmoeError(
            "memory coefficients",
            f"lcmoe/data/{COEFFICIENTS_FILE}",
            "the file is missing, and the memory estimate needs its fitted coefficients",
            "reinstall lcmoe, or regenerate it with python benchmarks/fit_memory.py --write",
        ) from None
    values = {k: float(v) for k, v in data.get("coefficients", {}).items()}
    return MemoryCoefficients(**values, fit=data.get("fit", {}))
