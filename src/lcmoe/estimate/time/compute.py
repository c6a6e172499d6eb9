"""Compute rates: dense GEMM (peak × efficiency, narrow-M and per-kernel shape costs), grouped expert
GEMM, flash attention and the Gated DeltaNet kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lcmoe.estimate.time.coefficients import TimeCoefficients, attention_efficiency_on_counted_flops

if TYPE_CHECKING:
    from lcmoe.estimate.time.amounts import RunAmounts


# Gated DeltaNet chunked kernel (FLA ``chunk_gated_delta_rule``, what Megatron's GDN calls),
# forward + backward seconds per (token × value head) at key and value head dims of 128, once
# T·H ≥ ~0.5 M (below, launch-bound): GB200 ≈ 6.0 ns (fla-org/flash-linear-attention README
# benchmarks: B1 T8192 H96 4.738 ms, B2 T16384 H16 3.616 ms, B4 T4096 H64 5.964 ms;
# kernel-rates-by-shape.md §4a). Hopper has no public forward + backward table; its forward runs
# 1.6× slower than GB200's on the same shape (H800 2.033 ms vs GB200 1.265 ms, B1 T8192 H96,
# PaddlePaddle/flash-attention PR #133), so 9.6 ns.
GDN_SECONDS_PER_TOKEN_HEAD = {"blackwell": 6.0e-9, "hopper": 9.6e-9}


def gdn_kernel_seconds(token_heads: float, architecture: str) -> float:
    """Forward + backward time of the GDN recurrence: token_heads (``gdn_token_heads``) ·
    GDN_SECONDS_PER_TOKEN_HEAD of the family (Hopper's for any other)."""
    return token_heads * GDN_SECONDS_PER_TOKEN_HEAD.get(architecture, GDN_SECONDS_PER_TOKEN_HEAD["hopper"])


# ----- rates -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GemmShapeCost:
    """How a GEMM's time departs from FLOPs / (peak · efficiency) with its shape, measured:
    t = 2·M·N·K · (1 + m_half / M) / (peak · e) + fixed_seconds. ``fixed_seconds`` is the cost of
    one GEMM kernel that does not scale with its FLOPs (launch, prologue, last-wave tail);
    ``m_half`` the row count at which a narrow-M GEMM runs at half its rate."""

    m_half: float
    fixed_seconds: float


# Fitted offline (least squares on log rate, not on any training row) to XLA's profiled GEMM grids,
# M ∈ 256…4096, N, K ∈ 1024…4096, batch 1 (kernel-rates-by-shape.md §1a sm_90 BF16, §1b sm_100
# BF16 / FP8-e4m3; tensorflow/tensorflow matmul_interpolator_data.h @372d578b, @a305421c): rms error
# 6.4% / 6.9% / 5.3% of the rate. The fixed time comes out the same on both families (6.4–6.8 µs
# per GEMM), so at twice the peak the same small GEMM loses twice the share on Blackwell: its
# small-GEMM penalty (§1b read-offs: 1024×1024×2048 at 21% of BF16 peak vs 35% on H100). Checks
# outside the fitted grid: H100 square 8192³ predicted 857 vs 798 measured (zzc0721 #79); B200
# 16384×6144×4096 BF16 1545 vs 1513 (vLLM PR #19566). Hopper FP8 and the Blackwell block-scaled
# FP8/FP4 kinds have no public grid: they take their family's nearest measured dtype.
GEMM_SHAPE_COSTS: dict[tuple[str, str], GemmShapeCost] = {
    ("hopper", "bf16"): GemmShapeCost(m_half=90.9, fixed_seconds=6.82e-6),
    ("blackwell", "bf16"): GemmShapeCost(m_half=54.4, fixed_seconds=6.41e-6),
    ("blackwell", "fp8"): GemmShapeCost(m_half=13.9, fixed_seconds=6.47e-6),
}


def gemm_shape_cost(architecture: str, tensor_core: str) -> GemmShapeCost:
    """The measured shape cost for a family and tensor-core kind (FP8-class kinds use the
    family's FP8 grid where there is one, else its BF16 grid; families other than Blackwell use
    Hopper's)."""
    family = "blackwell" if architecture == "blackwell" else "hopper"
    kind = "bf16" if tensor_core == "bf16" else "fp8"
    return GEMM_SHAPE_COSTS.get((family, kind)) or GEMM_SHAPE_COSTS[(family, "bf16")]


def narrow_m_factor(rows: float, cost: GemmShapeCost) -> float:
    """1 + m_half / M: the extra time of a GEMM with only M rows (tokens) against a wide one."""
    return 1.0 + cost.m_half / max(rows, 1.0)


def grouped_gemm_saturation(
    tokens_per_expert: float, c: TimeCoefficients, expert_gemm_size: float = 0.0, *, bf16: bool = False
) -> float:
    """n / (n + n½) · s / (s + s½): grouped GEMM efficiency falls when each local expert sees few
    tokens, and when each expert's GEMM (s = hidden · expert FFN / ETP) is small
    (kernels-and-links.md §2b: ~60% of peak at ≥ 2K tokens/expert, 11–16% at 512 for small N·K).
    ``bf16``: BF16 experts, at grouped_gemm_half_size_bf16 where the family sets one."""
    half = (c.grouped_gemm_half_size_bf16 or c.grouped_gemm_half_size) if bf16 else c.grouped_gemm_half_size
    size = expert_gemm_size / (expert_gemm_size + half) if expert_gemm_size > 0 else 1.0
    return tokens_per_expert / (tokens_per_expert + c.grouped_gemm_half_tokens) * size


def attention_saturation(chunk: float, c: TimeCoefficients) -> float:
    """L / (L + L½) for per-rank chunk length L (L½ from the cuDNN fwd+bwd sweep, see
    TimeCoefficients.attention_half_chunk)."""
    return chunk / (chunk + c.attention_half_chunk)


def window_attention_saturation(chunk: float, window: float, c: TimeCoefficients) -> float:
    """W / (W + L½) with W = min(window, chunk): a sliding-window kernel's query block attends only
    the W keys of its window, so its fixed per-block work is spread over W keys, not the chunk's
    (``attention_saturation`` at W; a full layer's when ``window`` is 0). Checks against the cuDNN
    training benchmark (kernel-rates-by-shape.md §3b), on Bridge's count of the window's FLOPs:
    GB200 BF16, W = 128, d 64: 0.574 (the Blackwell efficiency) · 128 / 1152 · 0.939 (GB200's
    clock) = 6.0% of peak vs 6.6% forward / 7.5% backward measured; H200 BF16, W = 1024, d 64:
    0.563 · 1024 / 2048 = 28% vs 36% / 30%. A full-attention rate at the chunk would put both
    near 50%."""
    return attention_saturation(min(window, chunk) if window > 0 else chunk, c)


# The measured range of attention_efficiency per family, at the family's reference GPU (H100,
# B200), from kernels-and-links.md §8 "BF16 causal, ≥ 8K" rows (forward low/high, backward
# low/high): H100 0.61–0.70 / 0.55–0.59, B200 0.59–0.72 / 0.43–0.60, combined on Bridge's count
# and divided by the saturation at a 16K chunk (0.94: the coefficient is the long-chunk asymptote).
# The shipped fit keeps the coefficient inside it: at 4K tokens (most published rows) attention is
# a fifth of the step and the data cannot tell it from the other terms, so the kernel measurements
# decide, and the long-context predictions (where attention is most of the step) follow them.
_AT_16K = attention_saturation(16384, TimeCoefficients())
ATTENTION_EFFICIENCY_MEASURED: dict[str, tuple[float, float]] = {
    "hopper": (
        attention_efficiency_on_counted_flops(0.61, 0.55) / _AT_16K,
        attention_efficiency_on_counted_flops(0.70, 0.59) / _AT_16K,
    ),
    "blackwell": (
        attention_efficiency_on_counted_flops(0.59, 0.43) / _AT_16K,
        attention_efficiency_on_counted_flops(0.72, 0.60) / _AT_16K,
    ),
}


def gemm_efficiency(tensor_core: str, c: TimeCoefficients) -> float:
    return {
        "bf16": c.gemm_efficiency_bf16,
        "fp8": c.gemm_efficiency_fp8,
        "mxfp8": c.gemm_efficiency_mxfp8,
        "nvfp4": c.gemm_efficiency_fp4,
    }[tensor_core]


def dense_fp8_gain(a: RunAmounts, c: TimeCoefficients) -> float:
    """What ``a``'s FP8-class dense GEMMs gain over BF16 ones at the efficiencies ``c``:
    (peak_p · e_p) / (peak_bf16 · e_bf16). E.g. H100 FP8 at 0.52 vs BF16 at 0.61 of peaks
    1979 / 989 TFLOP/s: 1.70. The prior for fp8_grouped_speedup (see TimeCoefficients)."""
    return (
        a.gemm_peak_flops_per_second
        * gemm_efficiency(a.tensor_core, c)
        / (a.bf16_peak_flops_per_second * c.gemm_efficiency_bf16)
    )


def nvfp4_dense_gain_over_mxfp8(a: RunAmounts, c: TimeCoefficients) -> float:
    """What NVFP4 dense GEMMs gain over MXFP8 ones at the efficiencies ``c``:
    (peak_fp4 · e_fp4) / (peak_fp8 · e_mxfp8); e.g. GB200 10 / 5 PFLOP/s at 0.36 / 0.54: 1.32."""
    fp4 = a.gemm_peak_flops_per_second * c.gemm_efficiency_fp4
    return fp4 / (a.fp8_peak_flops_per_second * c.gemm_efficiency_mxfp8)


def grouped_peak_flops_per_second(a: RunAmounts, c: TimeCoefficients) -> float:
    """The peak expert GEMMs are measured against: BF16's, × fp8_grouped_speedup for FP8-class
    (capped at the FP8 peak). NVFP4 experts: the FP8-class rate × the dense NVFP4 gain over
    MXFP8 (``nvfp4_dense_gain_over_mxfp8``), capped at the FP4 peak. Every expert's tokens are
    quantized on the way in, as for FP8, so the experts gain what the dense layers gain, not the
    4× of the raw FP4 peak over BF16: no fitted row runs NVFP4 experts, and Nemotron-3 Super's
    published NVFP4 runs are 3% (B200: −11%) faster than its MXFP8 ones where the raw peak
    predicted +40–76% (benchmarks/throughput_accuracy.py, held-out rows)."""
    fp8_class = a.bf16_peak_flops_per_second * c.fp8_grouped_speedup
    if a.tensor_core in ("fp8", "mxfp8"):
        return min(fp8_class, a.gemm_peak_flops_per_second)
    if a.tensor_core == "nvfp4" and a.fp8_peak_flops_per_second > 0:
        return min(fp8_class * nvfp4_dense_gain_over_mxfp8(a, c), a.gemm_peak_flops_per_second)
    return a.gemm_peak_flops_per_second
