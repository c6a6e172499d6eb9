"""HardwareSpec: one GPU and the system around it (NVLink domain, scale-out NIC, host link).

Units are SI and per GPU: bytes, FLOP/s, bytes/s. Bandwidths are **one-way (per direction)**
unless the field name says otherwise, since every transfer-time formula divides the bytes one
GPU sends by the rate it can send them at.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from lcmoe.errors import LcmoeError
from lcmoe.specs._validate import StrictSpec, validate_or_explain

PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")


# Physical ranges (issue #31: a value outside them is a typo or a unit slip, never a GPU). Each
# upper bound is ≥ 10× the largest shipping part in the catalog (GB300/B300, Dec 2026):
MAX_HBM_BYTES = 4 * 1024**4  # 4 TiB; B300 has 288 GB
MAX_PEAK_FLOPS = 1.0e17  # 100 PFLOP/s dense; GB300 NVFP4 dense is 15 PFLOP/s
MAX_HBM_BANDWIDTH = 1.0e14  # 100 TB/s; B300 has 8 TB/s
MAX_LINK_BANDWIDTH = 1.0e13  # 10 TB/s one way; NVLink 5 is 0.9 TB/s, NVLink-C2C 0.45 TB/s
MAX_SCALEOUT_BANDWIDTH = 1.0e12  # 8 Tb/s per GPU; ConnectX-8 is 800 Gb/s
MAX_HOST_MEMORY_BYTES = 64 * 1024**4  # 64 TiB per GPU; a GB300 tray has ~0.5 TB per GPU
MAX_DOMAIN_GPUS = 100_000  # NVL576 is the largest announced NVLink domain
MAX_GPUS_PER_NODE = 1024


class HardwareSpec(StrictSpec):
    """A GPU type in its usual system. Every value carries a source in ``sources``. Numbers are
    finite and within the physical ranges above (no true/false for numbers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    architecture: Literal["ampere", "hopper", "blackwell"] = "hopper"
    hbm_bytes: float = Field(
        gt=0, le=MAX_HBM_BYTES, description="memory torch can allocate on one GPU (usable, not marketing)"
    )
    peak_flops: dict[str, float] = Field(description="dense peak FLOP/s per precision: bf16, fp8, mxfp8, nvfp4")
    hbm_bandwidth: float = Field(gt=0, le=MAX_HBM_BANDWIDTH, description="HBM bytes/s (datasheet)")
    nvlink_bandwidth: float = Field(gt=0, le=MAX_LINK_BANDWIDTH, description="NVLink bytes/s per GPU, one way")
    nvlink_domain_size: int = Field(
        gt=0, le=MAX_DOMAIN_GPUS, description="GPUs reachable over NVLink (8 for HGX, 72 for NVL72)"
    )
    scaleout_bandwidth: float = Field(
        gt=0, le=MAX_SCALEOUT_BANDWIDTH, description="scale-out NIC bytes/s per GPU, one way"
    )
    host_link_bandwidth: float = Field(
        gt=0, le=MAX_LINK_BANDWIDTH, description="GPU↔host bytes/s, one way (PCIe or NVLink-C2C)"
    )
    host_link_kind: str = "pcie"
    host_memory_bytes: float = Field(gt=0, le=MAX_HOST_MEMORY_BYTES, description="host DRAM per GPU")
    gpus_per_node: int = Field(default=8, gt=0, le=MAX_GPUS_PER_NODE)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_peaks(self) -> HardwareSpec:
        if "bf16" not in self.peak_flops:
            raise ValueError("peak_flops must give bf16")
        for key, value in self.peak_flops.items():
            if key not in PRECISIONS:
                raise ValueError(f"peak_flops key {key!r} is not one of {', '.join(PRECISIONS)}")
            if not 0 < value <= MAX_PEAK_FLOPS:
                raise ValueError(f"peak_flops[{key}] = {value} must be > 0 and at most {MAX_PEAK_FLOPS:.0e} FLOP/s")
        return self

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for a precision; MXFP8 falls back to FP8 where the GPU has no MX format."""
        if precision in self.peak_flops:
            return self.peak_flops[precision]
        raise LcmoeError(
            "precision",
            precision,
            f"{self.name} has no {precision} tensor cores",
            f"use one of {', '.join(self.peak_flops)}",
        )

    def supports(self, precision: str) -> bool:
        return precision in self.peak_flops


def hardware_from_dict(data: dict[str, object], *, origin: str) -> HardwareSpec:
    """Build a HardwareSpec, turning pydantic's report into one sentence naming the field."""
    return validate_or_explain(HardwareSpec, data, origin=origin)
