"""Time-model coefficients: the fitted efficiencies and fixed rates (``TimeCoefficients``), their
bounds, and loading the shipped per-family values from ``lcmoe/data/time_coefficients.yaml``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any

import yaml

from lcmoe.errors import LcmoeError


@dataclass(frozen=True, slots=True)
class TimeCoefficients:
    """Efficiencies in (0, 1] and a few rates; fitted per hardware family by fit_time.py.

    Fixed values come from kernels-and-links.md (measured ceilings): grouped GEMM and attention
    half-saturation points, link efficiencies, dispatcher efficiencies."""

    gemm_efficiency_bf16: float = 0.70
    gemm_efficiency_fp8: float = 0.55
    # MXFP8 (1×32 block scales) apart from per-tensor / blockwise FP8: its quantization writes
    # row- and column-wise copies with their scale tensors, so the same tensor cores deliver less.
    gemm_efficiency_mxfp8: float = 0.55
    gemm_efficiency_fp4: float = 0.45
    grouped_gemm_efficiency: float = 0.55
    # FP8-class expert GEMMs over BF16 ones at the same efficiency, quantization included: the
    # kernels alone reach 2x (FP8 DeepGEMM 68% vs BF16 grouped 65% of their peaks,
    # kernels-and-links.md §2b), but each expert's tokens are quantized (row- and column-wise for
    # the backward) on the way in. Fitted where a family has both BF16 and FP8 MoE rows; where
    # it has not, fit_time.py sets it to the family's own dense FP8 gain (dense_fp8_gain), which
    # carries the same quantization cost, instead of this kernel-only prior.
    fp8_grouped_speedup: float = 2.0
    attention_efficiency: float = 0.55
    layer_overhead_seconds: float = 1.0e-4
    moe_layer_overhead_seconds: float = 2.0e-4
    # Host launch time per local expert of a MoE layer (forward + backward): without a fused
    # grouped kernel TE's GroupedLinear launches every expert's quantize and GEMMs on its own
    # (kernels-and-links.md §2b: cuBLAS loop vs single-launch CUTLASS, 3.9x at 8 experts).
    expert_host_seconds: float = 0.0
    # EP dispatch/combine link efficiencies (kernels-and-links.md §8): inside the NVLink domain
    # DeepEP reaches ~0.75–0.8 of NVLink one-way on H100 and HybridEP 0.54–0.85 of 900 GB/s on
    # GB200 (prior 0.75; fitted per family); across NICs a 400G link carries 0.92–0.98 of its rate
    # for large messages and DeepEP's internode kernels 43–58 GB/s of a 50 GB/s NIC: 0.9, measured,
    # not fitted (fitted, it sat on its bound, Hopper 1.0 and Blackwell 0.5). Fixing the NVLink one
    # at 0.75 as well cost the DSV3 H100 long-context series 3–5 points, so it stays fitted.
    ep_comm_efficiency: float = 0.75
    ep_network_efficiency: float = 0.9
    # Share of a ring step's KV exchange hidden behind that step's attention. The fit starts here
    # and a family whose rows never expose the ring (Blackwell: every CP row's attention outlasts
    # its NVLink exchange) keeps this prior: the Hopper fit on the DSV3 CP series (0.75).
    cp_ring_hidden: float = 0.75
    # Token permutation passes over HBM per MoE layer, forward + backward: permute and unpermute,
    # each a read and a write, in both passes (Megatron moe_utils.permute / unpermute) = 8. Fixed
    # at that count: fitted, it sat on its floor of 8 (Blackwell 8.01).
    moe_permute_passes: float = 8.0
    grouped_gemm_half_size: float = 0.0
    # The same half-size for BF16 expert GEMMs where it differs (0: grouped_gemm_half_size). Hopper's
    # fitted rows are all FP8 (current-scaling or blockwise TE GEMMs, whose per-expert quantize
    # work grows the small-expert loss: fitted s½ 9.1e6, i.e. 9% of peak at Qwen3-30B-A3B's
    # 2048 × 768 experts, where TE PR #2045 measures its BF16 per-expert cuBLAS path at 63%).
    # BF16 Hopper experts take the kernel's own loss as the Blackwell rows (MXFP8 and BF16, one
    # s½) fit it (benchmarks/fit_time.py BF16_HALF_SIZE_FROM).
    grouped_gemm_half_size_bf16: float = 0.0
    # Mamba-2 chunked-scan throughput on mamba_scan_flops_per_layer's count, an absolute rate
    # shared by every GPU: the SSD kernels (Triton, fp32 state math) scale with neither tensor-core
    # peak nor HBM — the Nemotron-3 rows leave about the same absolute per-token time unexplained
    # on H100 and GB200 without a scan term. Prior: the one public kernel timing found,
    # mamba_chunk_scan_combined forward at B=16, T=8192, 8 heads × 128, N=128, chunk 64: 6.25 ms
    # (fla-org/flash-linear-attention PR #50, GPU not stated) = 16.5 TFLOP/s on this count.
    # Fitted on the Nemotron-3 Nano rows (the only fitted hybrid). Where a fit has no hybrid row
    # (a leave-one-model-out refit without Nano) this prior is not used: the rate is set from the
    # held-out Nemotron-3 Super rows instead (benchmarks/fit_time.py with_mamba_scan_prior; 2.1e13,
    # Nano's LOMO error 13.3% -> 5.4%).
    mamba_scan_flops_per_second: float = 1.65e13
    # Fixed (not fitted), from kernels-and-links.md.
    grouped_gemm_half_tokens: float = 512.0
    # cuDNN 9.19 fwd+bwd on H200 (kernels-and-links.md §1a, Llama-3.1 shape) combined as
    # attention_efficiency_on_counted_flops: 340/431/486/517/521 TFLOP/s at 2K/4K/8K/16K/32K,
    # i.e. 0.65/0.83/0.93/0.99 of 32K; L / (L + 1024) gives 0.69/0.83/0.92/0.97 (GB200 §1b: same shape).
    attention_half_chunk: float = 1024.0
    elementwise_traffic_factor: float = 3.0
    nvlink_efficiency: float = 0.80
    scaleout_efficiency: float = 0.90
    tp_overlap_hidden: float = 0.6
    dp_exposed_fraction: float = 0.15
    cuda_graph_overhead_saving: float = 0.7
    # CPU Adam on the offloaded fraction, per rank: memory-bound at ~30 B touched per fp32 param
    # (param, grad, m, v read; param, m, v, bf16 copy written); an H100 DGX host's ~614 GB/s DDR5
    # over 8 ranks gives a ~2.6 G params/s roofline. Set from the one measured series: NVIDIA's
    # CPU-offloading skill card runs Qwen3-30B-A3B on 16 H100 (TP2 PP2 EP4, GBS 4) at optimizer
    # offload 25 / 50 / 75 / 100% in 1871 / 2484 / 3187 / 4189 ms (memory_points.csv), a slope of
    # 3091 ms per whole optimizer offloaded; lcmoe's step rises by 161 ms (host link) + 1.91e12
    # params / rate over that span, so rate = 1.91e12 / 2930 ms = 6.5e8 params/s, 25% of the
    # roofline, inside kernels-and-links.md §6's range (0.3 G/s at 2 threads per rank … ~1.4 G/s
    # DeepSpeed CPU-Adam per host). The former 1e9 (an assumed 40% of the roofline) put the
    # series' slope 33% low. Derived from the slope only: the series' absolute step times stay an
    # unfitted check (benchmarks/throughput_accuracy.py, verification runs).
    host_adam_params_per_second: float = 6.5e8
    # Sustained tensor-core clock of a GPU relative to its family's reference GPU (B200, H100),
    # beyond the datasheet peaks: the power limit decides how much of the peak a GPU holds under
    # load (B200 1000 W, B300 1100 W, GB200 1200 W, GB300 1400 W; kernels-and-links.md §2a
    # measures GB200 FP8 MAMF at 72% of its peak vs B200's 76%). Scales every compute rate; set
    # from the measured MAMF ratios where there are some (fit_time.py MEASURED_CLOCKS: GB200, B300),
    # fitted where not (GB300); a GPU not listed runs at 1.
    gpu_clock: dict[str, float] = field(default_factory=dict)
    fit: dict[str, object] = field(default_factory=dict)


# name → (lower, upper). Upper bounds are the measured ceilings of kernels-and-links.md §8 (BF16
# GEMM MAMF ≈ 0.80, FP8 ≈ 0.76, grouped GEMM ≤ 0.68, attention fwd+bwd ≤ 0.6; links ≤ 1), so
# neither the shipped fit (benchmarks/fit_time.py) nor a user calibration can claim more than the
# hardware was ever measured to deliver.
COEFFICIENT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency_bf16": (0.3, 0.82),
    "gemm_efficiency_fp8": (0.2, 0.78),
    "gemm_efficiency_mxfp8": (0.2, 0.78),
    "gemm_efficiency_fp4": (0.1, 0.78),
    # Ceiling 0.75: the asymptote (large tokens per expert) of the measured grouped GEMMs is
    # 0.71–0.72 (TE per-expert cuBLAS, H100 BF16; DeepGEMM FP8 contiguous, H800; fit_time.py
    # GROUPED_GEMM_ASYMPTOTE), above the 0.68 read at finite tokens per expert.
    "grouped_gemm_efficiency": (0.1, 0.75),
    "fp8_grouped_speedup": (1.0, 2.0),
    # Ceiling: the best measured forward/backward pair on Bridge's count (GB300 0.80 / 0.60 →
    # 0.554 at 16K, 0.59 asymptotically; see attention_efficiency_on_counted_flops), not a
    # forward-only rate.
    "attention_efficiency": (0.2, 0.6),
    "layer_overhead_seconds": (0.0, 3.0e-3),
    "moe_layer_overhead_seconds": (0.0, 3.0e-3),
    "expert_host_seconds": (0.0, 5.0e-4),
    "ep_comm_efficiency": (0.4, 1.0),
    "ep_network_efficiency": (0.5, 1.0),
    "nvlink_efficiency": (0.1, 1.0),
    "scaleout_efficiency": (0.1, 1.0),
    "cp_ring_hidden": (0.0, 1.0),
    # Token permutation passes over HBM per MoE layer (fwd + bwd): permute + unpermute, read +
    # write = 8 at least (Megatron moe_utils.permute/unpermute); router, sort and probability
    # scaling add more.
    "moe_permute_passes": (8.0, 64.0),
    # N·K (hidden × expert FFN / ETP) at which a grouped GEMM reaches half its large-shape
    # efficiency: small experts leave SMs idle (kernels-and-links.md §2b: 0.11–0.16 of peak for
    # small N·K at 512 tokens/expert vs 0.56–0.66 for large).
    "grouped_gemm_half_size": (0.0, 5.0e7),
    "mamba_scan_flops_per_second": (5.0e12, 1.0e15),
}


def attention_efficiency_on_counted_flops(forward: float, backward: float) -> float:
    """Attention efficiency on the FLOPs Bridge counts, from the kernel's forward and backward
    efficiencies: 3 / (1/e_fwd + 2.5/e_bwd).

    Bridge counts core attention as 3× the causal forward (backward = 2× forward,
    flop_utils.py), while the kernels run a backward of 5 GEMMs against the forward's 2, i.e.
    2.5× the forward FLOPs, at their own rate (kernels-and-links.md "FLOP counting conventions").
    Time = F/e_fwd + 2.5·F/e_bwd for a counted 3·F, hence the formula. Example: H100 forward 0.65,
    backward 0.57 → 3 / (1.54 + 4.39) = 0.51 — far below the forward-only rate.
    """
    return 3.0 / (1.0 / forward + 2.5 / backward)


SHIPPED_COEFFICIENTS_FILE = "time_coefficients.yaml"


@functools.cache
def _shipped() -> dict[str, Any]:
    """The shipped coefficient file (lcmoe/data/time_coefficients.yaml). Missing, it is an install
    error, not a reason to predict with the unfitted defaults."""
    path = resources.files("lcmoe.data").joinpath(SHIPPED_COEFFICIENTS_FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LcmoeError(
            "time coefficients",
            f"lcmoe/data/{SHIPPED_COEFFICIENTS_FILE}",
            "file not found: the step-time model needs its fitted coefficients",
            "reinstall lcmoe (pip install --force-reinstall lcmoe) or restore the file",
        ) from None
    return yaml.safe_load(text) or {}


def coefficients_from_values(values: dict[str, Any], fit: dict[str, object]) -> TimeCoefficients:
    """TimeCoefficients from a {name: number} mapping (the shipped YAML or a user calibration);
    names that are not coefficients are ignored, absent ones keep their defaults."""
    known = {f.name for f in fields(TimeCoefficients)} - {"fit", "gpu_clock"}
    clocks = {str(k): float(v) for k, v in (values.get("gpu_clock") or {}).items()}
    return replace(
        TimeCoefficients(), **{k: float(v) for k, v in values.items() if k in known}, gpu_clock=clocks, fit=fit
    )


def shipped_time_coefficients(architecture: str) -> TimeCoefficients:
    """The coefficients shipped for a hardware family (hopper, blackwell; ampere uses hopper's)."""
    data = _shipped()
    families: dict[str, dict[str, Any]] = data.get("families") or {}
    values = dict(families.get(architecture) or families.get("hopper") or {})
    values["gpu_clock"] = (data.get("gpu_clocks") or {}).get(architecture) or {}
    fit = dict(data.get("fit") or {})
    # Software factors of older containers (benchmarks only; lcmoe predicts the reference one).
    fit["containers"] = (data.get("containers") or {}).get(architecture, {})
    fit["reference_container"] = (data.get("reference_containers") or {}).get(architecture)
    return coefficients_from_values(values, fit)
