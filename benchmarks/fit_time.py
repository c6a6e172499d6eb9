"""Fit the step-time model's efficiencies per hardware family and ship them.

Data: perf_summary.csv ⋈ perf_recipes.csv (the recipe settings behind each published row) for
catalog models, plus long_context.csv (the DSV3 H100 CP-scaling series and Qwen3-235B GB200).
Target: published model TFLOP/s/GPU. Residual: log(predicted / published), plain least squares
(FIT_LOSS: chosen by leave-one-model-out error over robust alternatives, see there). One joint
fit: each family (hopper, blackwell) gets its own dense-GEMM efficiency per precision class,
grouped-GEMM and attention efficiencies, dense-layer host time and EP-link efficiencies; the
software's own terms (MoE host launch time per layer and per local expert, the Mamba scan rate:
SHARED, and one throughput trend per month of container age: SHARED_RELEASE_RATE,
release_factor, in place of a factor per container) are common to both; the CP-ring hidden
share is fitted on the long-context rows (the only CP > 1 data). GPUs other than the family
reference run at their measured sustained share of peak (MEASURED_CLOCKS). Every
efficiency is bounded by a measured kernel ceiling (see BOUNDS), and the attention efficiency by
the family's measured kernel range (family_bounds). Coefficients a kernel or link measurement
gives are fixed at it, not fitted (PRIORS). Prints the fitted parameter count, rows per
parameter and every coefficient within 1% of a bound; ``--lomo`` refits without each model and
stores the per-model figures (``--write``).

    pip install '.[bench]'
    python benchmarks/fit_time.py [--write] [--lomo]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from scipy.optimize import least_squares, minimize_scalar

from benchmarks.perf_rows import (
    LONG_CONTEXT,
    PerfCase,
    container_factor,
    long_context_cases,
    perf_cases,
    reference_container,
    split_time_holdout,
    version_key,
)
from benchmarks.published import REFERENCE, REPO, write_coefficients
from lcmoe.estimate.time import (
    ATTENTION_EFFICIENCY_MEASURED,
    COEFFICIENT_BOUNDS,
    RunAmounts,
    TimeCoefficients,
    combine,
    dense_fp8_gain,
    time_amounts,
)

OUTPUT = REPO / "src" / "lcmoe" / "data" / "time_coefficients.yaml"
# The fitted subset of the shared bounds (measured ceilings; see time.py COEFFICIENT_BOUNDS).
BOUNDS = {k: v for k, v in COEFFICIENT_BOUNDS.items() if k not in ("nvlink_efficiency", "scaleout_efficiency")}


def parameters_for(cases: list[PerfCase]) -> list[str]:
    """Only the parameters some row of the family exercises."""
    names = ["gemm_efficiency_bf16", "attention_efficiency", "layer_overhead_seconds"]
    precisions = {c.run.options.tensor_core_precision for c in cases}
    if "fp8" in precisions:
        names.append("gemm_efficiency_fp8")
    if "mxfp8" in precisions:
        names.append("gemm_efficiency_mxfp8")
    if "nvfp4" in precisions:
        names.append("gemm_efficiency_fp4")
    if any(c.run.model.is_moe for c in cases):
        # The NIC's EP efficiency and the permute passes are measured / counted (TimeCoefficients).
        names += [
            "grouped_gemm_efficiency",
            "ep_comm_efficiency",
            "moe_layer_overhead_seconds",
            "expert_host_seconds",
            "grouped_gemm_half_size",
        ]
    moe_precisions = {c.run.options.tensor_core_precision for c in cases if c.run.model.is_moe}
    if "bf16" in moe_precisions and moe_precisions & {"fp8", "mxfp8"}:
        names.append("fp8_grouped_speedup")
    if any(c.run.model.mamba_num_heads for c in cases):
        names.append("mamba_scan_flops_per_second")
    if any(c.run.layout.cp > 1 for c in cases) and _moves_residuals(cases, "cp_ring_hidden"):
        names.append("cp_ring_hidden")
    return names


def _moves_residuals(cases: list[PerfCase], name: str) -> bool:
    """Whether any row's prediction depends on coefficient ``name`` across its bounds. Where none
    does (Blackwell's CP rows: every ring step's attention outlasts its NVLink exchange), the
    coefficient is not fitted and keeps its prior instead of drifting to an arbitrary bound."""
    low, high = BOUNDS[name]
    at = [residuals(cases, dataclasses.replace(TimeCoefficients(), **{name: v})) for v in (low, high)]
    return bool(np.any(np.abs(at[0] - at[1]) > 1e-9))


_AMOUNTS: dict[int, RunAmounts] = {}


def amounts(case: PerfCase) -> RunAmounts:
    """Coefficient-free amounts, computed once per case (the fit only changes rates)."""
    key = id(case)
    if key not in _AMOUNTS:
        _AMOUNTS[key] = time_amounts(case.run)
    return _AMOUNTS[key]


def predicted_tflops(case: PerfCase, coefficients: TimeCoefficients) -> float:
    """The model's TFLOP/s for the case's own container (reference-container prediction × the
    container's fitted software factor)."""
    return combine(amounts(case), coefficients).model_tflops_per_gpu * container_factor(coefficients, case.container)


def residuals(cases: list[PerfCase], coefficients: TimeCoefficients) -> np.ndarray:
    return np.array([np.log(predicted_tflops(c, coefficients) / c.published_tflops) for c in cases])


CONTAINER_FACTOR_BOUNDS = (0.5, 2.0)
# Throughput lost per month of software age, for the release trend (release_factor): bounds
# (none, 5%/month); the published tables' repeated configurations move by ~0.5–2%/month.
RELEASE_RATE_BOUNDS = (0.0, 0.05)
# The GPU each family's datasheet-peak rates are taken at; the others run at their measured
# sustained share of peak relative to it (MEASURED_CLOCKS), or, where no measurement exists, at
# a fitted clock factor.
REFERENCE_GPUS = ("h100", "b200")
# BF16 MAMF (maximum achievable matmul FLOP/s, large aligned shapes) as a share of each GPU's
# datasheet peak, over the family reference's (kernels-and-links.md §2a, stas00/ml-engineering
# compute/accelerator/README.md): GB200 72.9% / B200 77.6%, B300 78.6% / 77.6%; H200 "same as
# H100". GB300 has no MAMF measurement; both it and GB200 are rated at 2.5 PF BF16, so its factor
# is GB200's × the measured GB300 / GB200 throughput of the Megatron-Core MoE report's DeepSeek-V3
# pair, 1233 / 1048 TFLOP/s/GPU (arXiv 2603.07685; kernels-and-links.md §4): 1.105. (Fitted, it
# came out 1.107–1.122; the report's Qwen3-235B pair, 974 / 919, would give 0.996 and costs
# leave-one-model-out MAPE +0.4 points; the GB300 TGP of 1400 W against GB200's 1200 W is the
# likely cause of a higher sustained clock, and GB300's doubled SFU rate speeds its attention.)
MEASURED_CLOCKS = {"gb200": 72.9 / 77.6, "b300": 78.6 / 77.6, "h200": 1.0, "gb300": 72.9 / 77.6 * 1233 / 1048}
# Typical row residual (log units), the scale of the robust loss.
ROW_SCALE = 0.1


def release_months(container: str) -> int:
    """Months since 2000 of a NeMo container tag "YY.MM[.patch]" (0 if not of that form)."""
    parts = container.split(".")
    return 12 * int(parts[0]) + int(parts[1]) if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else 0


def release_factor(container: str, reference: str, rate: float) -> float:
    """Throughput of ``container`` relative to the ``reference`` container: exp(−rate · months
    older). One rate per family replaces a factor per container: Bridge's performance summary
    republishes the same configurations release after release and their throughput rises
    steadily (perf_summary.csv status dropped_or_revised vs current; the long-context guidance's
    LC-CONTAINER rule: "use the newest container")."""
    months = release_months(reference) - release_months(container)
    return float(np.exp(-rate * months)) if release_months(container) else 1.0


# Loss on the residuals, chosen by cross-validation (leave-one-model-out MAPE, MoE rows / all
# rows, same data and bounds): linear 9.43 / 8.97%, cauchy 9.17 / 9.63%, soft_l1 10.02 / 9.50%,
# huber 10.10 / 9.65%, arctan (no convergence in 200 evaluations) 9.89 / 9.51%. Robust losses
# fit the rows they keep a little closer (fit MAPE 4.9–5.2% vs 5.3%) but, by discounting the rows
# that disagree, lean on fewer of them and predict an unseen model worse. Plain least squares
# also makes the container prior the log-normal its comment states.
FIT_LOSS = "linear"

# Mechanisms tried against the shipped model (fit MAPE 5.41%, LOMO 8.71%, LOMO MoE 10.19%; same
# data, bounds and loss) and not kept, as in-sample / LOMO all / LOMO MoE (%):
# - HybridEP charged as host-syncing outside a full-iteration graph (its dropless count read-back):
#   6.39 / – / – (Nemotron LOMO 15.3, Qwen3-235B 15.2; stopped early).
# - EP time max(NVLink, NIC) instead of their sum (links driven concurrently): 5.39 / 9.88 / 12.13
#   (Qwen3-30B LOMO +12.7% bias).
# - Only the MoE block's host time exposed after a dispatcher's sync (the attention block's launches
#   still run ahead): 5.64 / 8.77 / 10.10 — within noise, and it moves the bound from Hopper
#   layer_overhead_seconds to the shared moe_layer_overhead_seconds (0.003 ceiling).
# - FP8 quantization traffic of the expert operands, (8·h + 4·(1 + glu)·ffn) B per routed token over
#   HBM: 5.47 / 9.07 / 10.81 (the fit raises fp8_grouped_speedup to compensate).
# - grouped_gemm_half_size fixed at 2.0e6 from the H100 torch._grouped_mm row at Qwen3-30B's expert
#   shape (kernel-rates-by-shape.md §2, 242 TFLOP/s): 6.44 / 9.85 / 11.95, Qwen3-30B LOMO +12.3% —
#   the training rows want small experts ~4x slower than the kernel alone (fitted Hopper ~8.6e6):
#   the size factor stands in for per-routed-token work the model does not itemise.
# - No EP hiding under overlap_moe_expert_parallel_comm with a host-syncing dispatcher:
#   6.53 / 13.56 / 18.19.
# - grouped_gemm_half_size replaced by a fixed time per routed (token, expert) pair, fitted per
#   family: it stays at 0 and the fit runs without any size term, 5.46 / 10.79 / 13.48 (Qwen3-30B
#   LOMO +18.7%); shared by both families: 6.60 / 11.92 / 15.39. The size factor carries the
#   Qwen3-30B extrapolation and is kept.
# Round 3 (against the 24-parameter model above; in-sample / LOMO all / LOMO MoE %, plus the
# never-fitted verification runs of memory_points.csv, 31.3% there):
# - Expert GEMMs on TE's per-expert path (one cuBLAS GEMM per local expert, TE docs "Mixture of
#   Experts", Grouped GEMM) each paying GemmShapeCost.fixed_seconds, 6 kernels per expert (the
#   GEMMs) or 12 (with the per-expert quantize), size factor kept: 5.57 / – / – and 5.44 / – / –,
#   Qwen3-235B GB200 4K long-context +18.5% / +16.4%, verification 33.8% / 33.4%; with the size
#   factor removed: 7.92 / 13.60 / 18.88 (Qwen3-30B LOMO +34.8%). Rejected.
# - Attention fixed at the middle of each family's measured range (Hopper 0.539, Blackwell 0.4995):
#   5.49 / 8.52 / 10.13, but DSV3 256K +8.2% and Qwen3-235B 128K −10.7% (a slower attention hides
#   more of the CP ring); with EP efficiency fixed as well (Hopper 0.78, Blackwell 0.636):
#   5.49 / 9.23 / 11.18 (Qwen3-30B LOMO +15.8%). Hopper is fixed at the top of its range instead.
# - layer_overhead_seconds fitted once for both families: 5.76 / – / –, Blackwell EP efficiency to
#   its 1.0 ceiling, verification 36.0%.
# - Blackwell fp8_grouped_speedup fixed at torchao's B200 MXFP8 / BF16 grouped ratio at DSV3
#   shapes (1.19–1.60, median 1.38; kernel-rates-by-shape.md §2): 5.90 / – / –, Blackwell BF16
#   GEMM efficiency to its 0.82 ceiling.
# - Kept (PRIORS): Hopper attention and EP efficiency, both families' layer host time and grouped
#   GEMM asymptote fixed at measured values: 24 → 18 fitted parameters, 5.56 / 8.72 / 10.06, no
#   fitted coefficient within 1% of a bound (was 6), DSV3 H100 long-context −3.6…+1.9%;
#   verification 35.9% (the MoE host time moves from Hopper's layer term, 3 ms on its ceiling, to
#   the shared per-MoE-layer term, 2.9 ms, which the small host-syncing verification runs feel).
# Round 4 (against the 18-parameter model: in-sample / LOMO all / LOMO MoE %, 5.56 / 8.72 / 10.06):
# - Blackwell fp8_grouped_speedup, where no BF16 MoE row fits it, at torchao's measured 1.38
#   (MEASURED_FP8_GROUPED_SPEEDUP) instead of the dense FP8 gain (2.0 at its ceiling):
#   5.56 / 8.62 / 9.89 (Qwen3-235B LOMO 9.4 -> 8.7). Kept.
# - HybridEP charged as host-syncing like DeepEP (its dropless count read-back): 6.54 / 10.37 /
#   11.80, Qwen3-235B LOMO 15.1%. Rejected (see time/host.py HOST_SYNCING_DISPATCHERS).
# - GB300 at B300's measured sustained clock (no fitted GB300 factor): 6.18 / 9.34 / 10.51.
#   Rejected: the fitted 1.107 stays, a factor no cited source explains yet.
# - Blackwell EP efficiency at its 0.75 prior: 5.65 / 8.64 / 10.04. Rejected (kept fitted).
# - Blackwell attention at the top of its measured range: 5.57 / 8.57 / 9.75. Kept (PRIORS).
# - Hopper cp_ring_hidden at its 0.75 prior: 5.67 / 8.65 / 9.94, but with the Blackwell change
#   the DSV3 H100 CP series ends at +7.8% (128K) and +11.8% (256K), outside ±7%: kept fitted.
# Round 5 (against the 15-parameter model: 5.77 / 8.15 / 8.95, 12.1 rows per parameter):
# - Blackwell fp8_grouped_speedup fixed at torchao's 1.38: 6.08 / 9.59 / 10.72, the shared MoE host
#   time to its 3 ms ceiling. Rejected: the BF16 Qwen3-235B rows want ~1.05, as GB200's measured
#   MXFP8 / BF16 GEMM-only gain at narrow expert shapes (1.11–1.14, kernel-rates-by-shape.md §1e)
#   suggests. Fixed at 1.125 from that (with the two kept changes below): 6.15 / 9.32 / 10.22,
#   Qwen3-235B GB200 4K long-context +4.4% (from +15.8%). Rejected: 1.5 points of LOMO.
# - GB300 clock from the MoE report's DSV3 GB300 / GB200 pair (MEASURED_CLOCKS): 5.80 / 8.19 /
#   8.93; from its Qwen3-235B pair (0.996 → 1.049 at the mean): 6.22 / 8.60 / 9.25. Kept (DSV3).
# - One release rate for both families (SHARED_RELEASE_RATE), with the GB300 clock: 5.88 / 8.19 /
#   8.76, 13 parameters. Kept.
# - Hopper cp_ring_hidden at its 0.75 prior (with both): 6.00 / 8.17 / 8.73 but DSV3 H100 at
#   128K +8.5% and 256K +12.1%. Rejected again.
# - expert_host_seconds fixed at EXPERT_HOST_SECONDS (with both): 5.87 / 8.18 / 8.75, 12
#   parameters, 15.1 rows per parameter. Kept.
# - The long-context card's rows at container 26.02.01 instead of the newest (the card reads
#   validated_on 2026-04-01, megatron-bridge-facts.md §6.3; 26.02.01 was the newest container then,
#   26.04 first appears 2026-04-17): 6.08 / 8.26 / 8.86, Qwen3-235B GB200 4K +5.7% and 128K −9.4%, the DSV3
#   H100 series −10.3 / −11.4 / −10.8% at 4K / 16K / 32K. Rejected: the card's runs fit as the newest
#   software, the 4K Qwen3-235B row stays the one outlier.
# - No small-expert size factor for BF16 experts (grouped_gemm_saturation's s / (s + s½) for FP8
#   only: TE PR #2045 measures BF16 at Qwen3-30B's expert shape at 63% of peak, where s½ = 9.1e6
#   puts it at 9%): leave-one-model-out MoE 8.75% → 9.39%, the verification runs' MAPE 37.0% →
#   53.9% (Qwen3-30B's BF16 HybridEP runs from 0.5x measured to +40%). Rejected: the fitted rows
#   hold no BF16 Hopper MoE run to set a BF16 size factor, and dropping it over-corrects.
# - The 14 verification runs with a measured throughput added to the fit: 8.20 / 9.69 in-sample
#   (all / MoE), moe_layer_overhead_seconds on its bound. Rejected: their layouts (HybridEP,
#   packed SFT, small GBS) carry mechanisms the model does not have, which the fit then hides in
#   host time.
# - An expert operand-cast term (FP8-class experts: per routed token d_e + f/etp forward and
#   d_e + g·f/etp backward elements cast at 2 B read + 1 + 1 B written, +2 B amax read for current
#   scaling, over HBM): 5.93 / 8.38 / 9.01, Blackwell fp8_grouped_speedup 1.054 → 1.116 (nearer
#   the measured GEMM-only MXFP8 gain, 1.11–1.14) and Hopper s½ 9.1e6 → 8.2e6; the Qwen3-30B BF16
#   verification runs −50.6% → −47.4%, Nemotron-3 Super held out unchanged. Rejected: leave-one-
#   model-out error rises and the held-out rows do not move.

# Round 6 (against the 12-parameter model: 5.87 / 8.18 / 8.75, Nemotron-3 Nano LOMO 13.3%, bias
# −13.3%: with Nano left out no fitted row is a Mamba hybrid and the scan fell back to its 1.65e13
# kernel prior; the LOMO Nano error is a function of that fallback alone: 1.65e13 −13.3%, 2.0e13
# −6.8%, 2.3e13 −2.3%, 2.8e13 +3.7%, 3.5e13 +10.1%, 4.7e13 +17.5%, 6.7e13 +24.9% bias):
# - The scan priced from its kernels alone: the H100 SSD forward (vLLM PR #27299, 1.21–1.29e7
#   tokens/s at 128 heads: ~40 ns per token at Nano's 64 heads) × the measured chunked-scan
#   fwd+bwd / fwd ratio (FLA GDN, GB200: 3.5–3.8), plus HBM passes of the causal conv1d (forward,
#   its recompute in backward, backward: ~84 KB per token) and the gated RMSNorm (~40 KB) at the
#   SSD forward's own bandwidth share: ~200–240 ns per token per Mamba layer on H100, i.e.
#   ~4.5e13 on this count. Not kept: Nano's rows say ~400–500 ns (gap between measured step time
#   and the step without a scan term, every GPU alike: H100 450–545, GB200/B200 457–509,
#   GB300/B300 372–409 ns), so this fallback gives Nano LOMO ≈ +17%; the kernel accounting
#   explains about half of the Mamba layer's non-GEMM time and no public Mamba-2 backward timing
#   exists to close it (kernel-rates-by-shape.md §4b, §7).
# - Fallback from the held-out hybrid's rows (with_mamba_scan_prior, MAMBA_PRIOR_EXCLUDED_PRECISIONS):
#   Nemotron-3 Super, every TP1 non-NVFP4 row (9): 1.87e13, Nano LOMO 9.06% (−9.0%), MoE LOMO
#   7.99%; every MXFP8 row (13, TP2 included): 1.60e13, Nano 14.3%; TP1 rows within the fitted
#   rows' local-expert range (6, B300's 64-expert EP8 rows out): 2.12e13, those rows fitted to
#   0.7% with no bias, Nano 5.43% (−4.9%). Kept (the last): 5.87 / 7.35 / 7.35, Nano LOMO 5.43%,
#   in-sample and the shipped coefficients unchanged (Nano present, the scan is fitted on it).
# - The scan never fitted, always at that Super-derived rate (the other terms refit at it; 11
#   parameters, 16.5 rows per parameter): 6.15 / 8.72 / 9.56, Qwen3-30B LOMO 15.7% (bias +15.5%),
#   DeepSeek-V3 7.7%: Nano's misfit then moves the shared MoE host time (2.78 → 2.89 ms) and
#   Blackwell's EP efficiency (0.599 → 0.650) instead. Rejected: fitted on Nano, the scan keeps
#   Nano's unexplained Mamba-layer time out of the terms the other MoE models share.
# - Qwen3-235B GB200 long-context 4K row (+15.5%) looked at, not resolved: it runs BF16 PP4 VPP12 at
#   GA 32, the perf table's BF16 GB200/GB300 rows (25.11, PP8 VPP3 GA 256 and PP4 VPP12 GA 64) come
#   out −8.6% / −12.6% and its MXFP8 rows −3…+5%; at GA 32 the interleaved bubble is
#   (pp − 1) / (vpp · GA) = 0.8% in the model, so a per-microbatch cost of the 12 virtual stages
#   (their P2P hand-offs or host work at 2 layers a chunk) is the candidate; none is priced yet.

# Round 7 (against the 12-parameter model: 5.87 / 7.35 / 7.35; Qwen3-235B GB200 long-context 4K
# +15.5%, 128K −0.5%):
# - Blackwell fp8_grouped_speedup fixed at GB200's measured MXFP8 / BF16 GEMM-only gain at narrow
#   expert shapes, 1.125 (MEASURED_FP8_GROUPED_SPEEDUP; fitted, 1.054, below every measurement):
#   5.89 / 7.30 / 7.25, 11 parameters (16.5 rows per parameter), none near a bound; 4K +12.6%,
#   128K −1.2%; the 25.11 BF16 perf rows −8.6 / −12.6% → −10.4 / −14.4% and the Blackwell EP
#   efficiency 0.599 → 0.559 (those rows now ask the shared terms for the speed the BF16 experts
#   lost). time_bands: coverage 86.7 → 86.2%, median band 15.7 → 19.5%, nested coverage 80.7 →
#   79.0%: refit without Qwen3-30B, its MXFP8 rows come out 6–9 points slower (the BF16 Qwen3-235B
#   rows then set the Blackwell EP efficiency). Kept (Round 5 had rejected 1.125 against the
#   15-parameter model for +1.3 points of LOMO; here LOMO falls).
# - The 4K row's remaining +12.6%: its layers are those of the 25.11 GB200 BF16 perf row (TP1 EP32
#   HybridEP, MBS1, graphs attn / moe_router / moe_preprocess: equal per-layer amounts), which
#   measured 728 TFLOP/s on 25.11 where the card's 4K point measured 698; the model rates both alike
#   at the newest software (786 and 770 before the container factor). Both cannot come within ±7%
#   while BF16 runs follow the release trend fitted on FP8-class rows, and no BF16 configuration is
#   republished across containers to say whether BF16 gained. Not resolved: the card's baseline
#   point states no container (unexpressible), not a missing per-layer mechanism.
# - A per-virtual-stage PP cost (PP4 VPP12: 24 chunk passes per microbatch, ~2 layers each):
#   Megatron's interleaved steady state posts each chunk's send/recv after it and waits only before
#   the next chunk of that direction, with each rank two warmup microbatches ahead of the next
#   (schedules.py get_pp_rank_microbatches, forward_backward_pipelining_with_interleaving; Bridge
#   sets overlap_p2p_comm for VPP > 1, comm_overlap.py): a hop stays hidden while shorter than
#   about three quarters of a chunk's forward (4K: 33.5 MB at 45 GB/s, 0.75 ms, against ~5 ms).
#   Any per-chunk charge would also slow the GB300 PP4 VPP12 rows (MXFP8 −3…+5%, BF16 25.11
#   −14%), already right or slow. Not priced.


def family_bounds(architecture: str) -> dict[str, tuple[float, float]]:
    """BOUNDS, with attention held to the family's measured kernel range (time.py
    ATTENTION_EFFICIENCY_MEASURED; ampere uses hopper's)."""
    measured = ATTENTION_EFFICIENCY_MEASURED.get(architecture, ATTENTION_EFFICIENCY_MEASURED["hopper"])
    return BOUNDS | {"attention_efficiency": measured}


# Coefficients of the software rather than the GPU, fitted once on every family's rows: the
# host launch path (the same Megatron/TE Python on DGX x86 and Grace hosts), the share of EP
# dispatch the 1F1B a2a-overlap schedule hides, and the Mamba scan rate (TimeCoefficients).
# Sharing them lets each family's rows inform the other's (a model left out is then still seen
# through these terms on the other family).
SHARED = ("moe_layer_overhead_seconds", "expert_host_seconds", "mamba_scan_flops_per_second")
# One software trend for both families, not one per family: the same NeMo containers (25.09 …
# 26.06.01) ship to DGX H100 and GB200/B200 systems alike, and the perf summary republishes
# both families' configurations at each release. Chosen by leave-one-model-out error (Round 5).
SHARED_RELEASE_RATE = True

# Host launch time of one transformer layer, forward + backward, without CUDA graphs: about 100
# kernel launches (TE's layer: norm+QKV, RoPE, attention, projection, bias-dropout-add, norm+fc1,
# activation, fc2, bias-dropout-add forward, ~2.5x that backward with the weight gradients, plus
# the FP8 casts) at the 7 µs per-op floor fitted on H100 (meta-pytorch/autoparallel PR #146;
# kernel-rates-by-shape.md §6: N_launch × 3–9 µs). The same Python drives DGX x86 and Grace hosts.
LAYER_HOST_SECONDS = 100 * 7e-6
# Host launch time per local expert of a MoE layer, forward + backward: TE's GroupedLinear on the
# multi-stream cuBLAS path issues one GEMM per expert for fc1 and fc2 forward (2) and their dgrad
# and wgrad (4), plus, in FP8, the per-expert casts of the two inputs and the two output
# gradients (4): 10 launches at the same 7 µs per-op floor as LAYER_HOST_SECONDS. Fitted, it came
# out 6.8e-5 (15 parameters) to 1.0e-4 (13); fixed, the fit loses nothing (Round 5).
EXPERT_HOST_SECONDS = 10 * 7e-6
# Grouped-GEMM efficiency at large tokens per expert (the asymptote of grouped_gemm_saturation):
# TE's per-expert cuBLAS path on H100 BF16 at 8 × 4096 tokens, N 768, K 2048 (Qwen3-30B's expert
# shape): 628 TFLOP/s = 0.635 of peak at a tokens-per-expert saturation of 4096 / (4096 + 512)
# (NVIDIA/TransformerEngine PR #2045) → 0.714; DeepGEMM FP8 contiguous, H800, 8192 tokens/group:
# 1346 TFLOP/s = 0.68 of the FP8 peak at saturation 0.94 → 0.72 (kernels-and-links.md §2b). No
# Blackwell table exists at these shapes (kernel-rates-by-shape.md §2 "Not found"): the Hopper
# ratio, as kernels-and-links.md §8 suggests. Fitted, it sat on its 0.7 ceiling in both families.
GROUPED_GEMM_ASYMPTOTE = 0.71

# FP8-class over BF16 expert GEMMs, measured; fixed (PRIORS), not fitted, where a family has a
# measurement (Round 7). GB200, MXFP8 vs BF16 GEMM-only at narrow expert shapes (cuDNN
# block-scaled dot): 1.11–1.14×, midpoint 1.125 (marin-community/marin#7282;
# kernel-rates-by-shape.md §1e). The narrow shape is what Bridge's BF16 MoE rows run (Qwen3-235B
# experts: N 1536, K 4096); torchao's B200 fwd+bwd at DSV3's wider experts (N 2048, K 7168,
# dynamic quantisation included) measures 1.19–1.59×, median 1.38 (pytorch/ao
# torchao/prototype/moe_training/README.md; §2). Fitted, it came out 1.054, below every
# measurement, which rated BF16 experts at 0.47 of GB200's datasheet peak where the measured
# Blackwell BF16 grouped range is 0.33–0.48 (torchao floor, SonicMoE ceiling; §2). Hopper has no
# such measurement and falls back to its dense FP8 gain (dense_fp8_gain) where it is not fitted.
MEASURED_FP8_GROUPED_SPEEDUP = {"blackwell": 1.125}

# Coefficients held at a measured value instead of fitted, per family; a coefficient fixed here
# leaves the fit's free parameters (fewer knobs: an unseen model is then predicted from kernel
# measurements, not from slack the fit gave another term). Chosen by leave-one-model-out error.
PRIORS: dict[str, dict[str, float]] = {
    "hopper": {
        # FA3's best measured H100 BF16 causal pair, forward 0.70 / backward 0.59 (kernels-and-links
        # §1a, §8) on Bridge's count: the top of ATTENTION_EFFICIENCY_MEASURED, where the fit sat.
        "attention_efficiency": ATTENTION_EFFICIENCY_MEASURED["hopper"][1],
        # DeepEP intranode dispatch/combine ~0.75–0.8 of NVLink one-way (kernels-and-links.md §8);
        # fitted, it sat on its 1.0 ceiling.
        "ep_comm_efficiency": 0.8,
        "layer_overhead_seconds": LAYER_HOST_SECONDS,
        "expert_host_seconds": EXPERT_HOST_SECONDS,
        "grouped_gemm_efficiency": GROUPED_GEMM_ASYMPTOTE,
    },
    "blackwell": {
        # cuDNN's best measured Blackwell pair (GB300 BF16 causal, forward 0.72 / backward 0.60,
        # kernels-and-links.md §1b) on Bridge's count: the top of ATTENTION_EFFICIENCY_MEASURED,
        # as for Hopper; fitted, it sat at 0.53 with no leave-one-model-out gain.
        "attention_efficiency": ATTENTION_EFFICIENCY_MEASURED["blackwell"][1],
        "layer_overhead_seconds": LAYER_HOST_SECONDS,
        "expert_host_seconds": EXPERT_HOST_SECONDS,
        "grouped_gemm_efficiency": GROUPED_GEMM_ASYMPTOTE,
        "fp8_grouped_speedup": MEASURED_FP8_GROUPED_SPEEDUP["blackwell"],
    },
}


# BF16 over FP8 dense GEMM efficiency (each on its own datasheet peak), measured: the MAMF ratio
# of the family's reference GPU (kernels-and-links.md §2a, stas00/ml-engineering
# compute/accelerator/README.md): H100 80.3% / 70.9%, B200 77.6% / 76.3%. BF16 efficiency is
# tied to the fitted FP8 one by it, not fitted: the free Hopper fit had landed on this ratio
# (0.654 / 0.575 = 1.14 vs 1.13), while the free Blackwell one put BF16 below FP8 (0.49 / 0.59)
# and moved it to 0.68 whenever DeepSeek-V3 was left out (its logits GEMM, the only BF16 GEMM of
# an FP8-class MoE row, absorbed its misfit).
BF16_OVER_FP8_EFFICIENCY = {"hopper": 80.3 / 70.9, "blackwell": 77.6 / 76.3}


def _fixed(family: str) -> dict[str, float]:
    return PRIORS.get(family, {})


def _tied(family: str, names: list[str]) -> dict[str, float]:
    """Coefficients derived from fitted ones ({name: ratio to its source}): BF16 GEMM efficiency
    from FP8's where the family's rows fit an FP8 efficiency."""
    if family in BF16_OVER_FP8_EFFICIENCY and "gemm_efficiency_fp8" in names:
        return {"gemm_efficiency_bf16": BF16_OVER_FP8_EFFICIENCY[family]}
    return {}


@dataclasses.dataclass(frozen=True)
class _FamilySlots:
    """Where one family's free parameters sit in the joint vector."""

    family: str
    cases: list[PerfCase]
    names: list[str]  # own (unshared) coefficients
    containers: list[str]  # older containers of the family (one release rate covers them)
    gpus: list[str]
    reference: str
    offset: int
    # An FP8-class MoE row whose dense FP8 gain sets fp8_grouped_speedup when the family has no
    # BF16 MoE rows to fit it from (None when it is fitted, or the family has no such rows).
    fp8_prior_case: PerfCase | None = None
    # Whether the family's release rate is its own slot (False: SHARED_RELEASE_RATE's one rate).
    own_rate: bool = True

    @property
    def width(self) -> int:
        return len(self.names) + (bool(self.containers) and self.own_rate) + len(self.gpus)


def _scale(name: str) -> float:
    units = {"moe_permute_passes": 10.0, "grouped_gemm_half_size": 1e7, "mamba_scan_flops_per_second": 1e13}
    return 1e-3 if name.endswith("_seconds") else units.get(name, 1.0)


def fit_families(cases: list[PerfCase], base: TimeCoefficients | None = None) -> dict[str, TimeCoefficients]:
    """Efficiencies per hardware family (SHARED ones common to all), plus one throughput factor
    per container relative to the family's newest (the software-release effect the guidance's
    LC-CONTAINER rule warns about; the shipped efficiencies therefore predict the newest
    container) and one sustained-clock factor per GPU but the family's reference GPU."""
    start_coeffs = base or TimeCoefficients()
    families = by_family(cases)
    wanted = {family: parameters_for(rows) for family, rows in families.items()}
    shared = [n for n in SHARED if any(n in names and n not in _fixed(f) for f, names in wanted.items())]
    lower: list[float] = [BOUNDS[n][0] for n in shared]
    upper: list[float] = [BOUNDS[n][1] for n in shared]
    scale: list[float] = [_scale(n) for n in shared]
    start: list[float] = [getattr(start_coeffs, n) for n in shared]
    # Older containers per family (the long-context card's runs are taken as the newest software,
    # no factor of their own, so their misfit stays visible and shapes the long-context terms).
    references = {family: reference_container(rows) for family, rows in families.items()}
    older = {
        family: sorted({c.container for c in rows} - {references[family], LONG_CONTEXT}, key=version_key)
        for family, rows in families.items()
    }
    # One release rate for every family: the same NeMo containers ship both (SHARED_RELEASE_RATE).
    shared_rate = SHARED_RELEASE_RATE and any(older.values())
    if shared_rate:
        lower.append(RELEASE_RATE_BOUNDS[0])
        upper.append(RELEASE_RATE_BOUNDS[1])
        scale.append(0.01)
        start.append(0.01)
    low_f, high_f = (float(np.log(b)) for b in CONTAINER_FACTOR_BOUNDS)
    slots: dict[str, _FamilySlots] = {}
    for family, rows in families.items():
        names = [n for n in wanted[family] if n not in shared and n not in _fixed(family)]
        names = [n for n in names if n not in _tied(family, names)]
        reference, containers = references[family], older[family]
        gpus = sorted({c.run.hardware.name for c in rows} - set(REFERENCE_GPUS) - set(MEASURED_CLOCKS))
        slot = _FamilySlots(
            family, rows, names, containers, gpus, reference, len(start), _fp8_prior_case(rows, names), not shared_rate
        )
        slots[family] = slot
        bounds = family_bounds(family)
        rate = [RELEASE_RATE_BOUNDS] if containers and not shared_rate else []
        lower += [bounds[n][0] for n in names] + [b[0] for b in rate] + [low_f] * len(gpus)
        upper += [bounds[n][1] for n in names] + [b[1] for b in rate] + [high_f] * len(gpus)
        scale += [_scale(n) for n in names] + [0.01] * len(rate) + [1.0] * len(gpus)
        start += [getattr(start_coeffs, n) for n in names] + [0.01] * len(rate) + [0.0] * len(gpus)
    lo, hi, sc = np.array(lower), np.array(upper), np.array(scale)
    x0 = np.clip(np.array(start), lo, hi) / sc

    def build(vector: np.ndarray, slot: _FamilySlots) -> TimeCoefficients:
        values = vector * sc
        own = values[slot.offset : slot.offset + len(slot.names)]
        if not slot.containers:
            rate = 0.0
        elif slot.own_rate:
            rate = float(values[slot.offset + len(slot.names)])
        else:
            rate = float(values[len(shared)])
        logs = values[slot.offset + slot.width - len(slot.gpus) : slot.offset + slot.width]
        clocks = {
            g: MEASURED_CLOCKS[g] for g in sorted({c.run.hardware.name for c in slot.cases} & set(MEASURED_CLOCKS))
        }
        clocks |= {g: float(v) for g, v in zip(slot.gpus, np.exp(logs), strict=True)}
        coefficients = dataclasses.replace(
            start_coeffs,
            **{n: float(v) for n, v in zip(shared, values[: len(shared)], strict=True)},
            **{n: float(v) for n, v in zip(slot.names, own, strict=True)},
            gpu_clock=clocks,
            fit={
                "num_fitted_parameters": len(x0),
                "fitted_names": [*shared, *slot.names],
                "release_rate_per_month": rate,
                "containers": {slot.reference: 1.0, LONG_CONTEXT: 1.0}
                | {k: release_factor(k, slot.reference, rate) for k in slot.containers},
                "reference_container": slot.reference,
            },
        )
        coefficients = dataclasses.replace(coefficients, **_fixed(slot.family))
        if _tied(slot.family, slot.names):
            bf16 = coefficients.gemm_efficiency_fp8 * BF16_OVER_FP8_EFFICIENCY[slot.family]
            coefficients = dataclasses.replace(coefficients, gemm_efficiency_bf16=bf16)
        if slot.fp8_prior_case is None:
            return coefficients
        low, high = BOUNDS["fp8_grouped_speedup"]
        measured = MEASURED_FP8_GROUPED_SPEEDUP.get(slot.family)
        gain = measured or dense_fp8_gain(amounts(slot.fp8_prior_case), coefficients)
        return dataclasses.replace(coefficients, fp8_grouped_speedup=min(high, max(low, gain)))

    def objective(vector: np.ndarray) -> np.ndarray:
        parts = []
        for slot in slots.values():
            parts.append(residuals(slot.cases, build(vector, slot)))
        return np.concatenate(parts)

    result = least_squares(objective, x0, bounds=(lo / sc, hi / sc), loss=FIT_LOSS, f_scale=ROW_SCALE, max_nfev=200)
    fitted = with_bf16_half_size({family: build(result.x, slot) for family, slot in slots.items()})
    if any(c.run.model.mamba_num_heads for c in cases):
        return fitted
    return with_mamba_scan_prior(fitted, mamba_prior_cases(cases))


# BF16 expert GEMMs of a family take the small-expert half-size another family's rows fit:
# Hopper's fitted rows are all FP8 MoE runs (their s½ carries TE's per-expert FP8 quantize work),
# so a BF16 Hopper expert GEMM is rated at the Blackwell fit's s½, where MXFP8 and BF16 MoE runs
# share one (TimeCoefficients.grouped_gemm_half_size_bf16). Chosen against the FP8 s½ (9% of peak
# at Qwen3-30B-A3B's expert shape, TE PR #2045 measures 63%) and against none (the kernel's 63%):
# the two BF16 Qwen3-30B-A3B H100 verification runs (never fitted; 287 / 299 TFLOP/s) come out at
# −49% / −51% with the FP8 s½, +40% with none (Round 5), +1% / −3% with the Blackwell one; the
# other BF16 H100 MoE runs there move with them (Nemotron-3 Super −36 / −39% → −3 / −8%, Nano
# −23% → +3%, Nemotron-3.5 Lightning −21 / +15% → +3 / +55%; Moonlight-16B +50% → +97%). The fit
# itself is unchanged: no fitted row runs BF16 experts on Hopper.
BF16_HALF_SIZE_FROM = {"hopper": "blackwell"}


def with_bf16_half_size(fitted: dict[str, TimeCoefficients]) -> dict[str, TimeCoefficients]:
    """``fitted`` with BF16_HALF_SIZE_FROM's families' BF16 half-size set from their source."""
    out = dict(fitted)
    for family, source in BF16_HALF_SIZE_FROM.items():
        if family in out and source in out:
            half = out[source].grouped_gemm_half_size
            out[family] = dataclasses.replace(out[family], grouped_gemm_half_size_bf16=half)
    return out


# The Mamba scan rate where no fitted row is a Mamba hybrid (a leave-one-model-out refit without
# Nemotron-3 Nano, the only fitted hybrid): fitted alone on the published rows of the held-out
# hybrid (perf_rows.TIME_HOLDOUT, Nemotron-3 Super: 128 Mamba heads of Nano's head, state and group
# dims) that run no mechanism outside the fitted rows' range, with every other coefficient at the
# refit's values. Its rows say the same per (token x Mamba head) time as Nano's: the full fit's
# 2.49e13 predicts its TP1 EP64 MXFP8 rows at +3…+7%, the 1.65e13 kernel prior (a forward-only FLA
# timing on an unstated GPU) at −13% on Nano. Kept apart from the fit (not its data): Super's
# rows check the FLOPs count and the memory estimator, and adding them would fit the MoE terms on
# a LatentMoE model too. Rows kept: not NVFP4 (its BF16 tail of 14 layers, the holdout's reason),
# TP 1 (its GB200 rows' TP2 LatentMoE dispatch) and no more local experts than any fitted MoE row
# (B300's EP8 puts 64 on a GPU, the fitted rows at most 32; those rows come out 16–24% fast).
# Read from the reference data (load_held_out_cases) whatever rows the fit itself is given.
MAMBA_PRIOR_EXCLUDED_PRECISIONS = ("nvfp4",)


def mamba_prior_cases(fitted_cases: list[PerfCase]) -> list[PerfCase]:
    """The held-out Mamba-hybrid rows whose layouts stay inside ``fitted_cases``' range (see
    MAMBA_PRIOR_EXCLUDED_PRECISIONS): TP 1, not NVFP4, local experts ≤ the fitted MoE rows' most."""
    local = [c.run.model.num_moe_experts // c.run.layout.ep for c in fitted_cases if c.run.model.is_moe]
    most = max(local, default=0)
    return [
        c
        for c in load_held_out_cases()
        if c.run.model.mamba_num_heads
        and c.run.layout.tp == 1
        and c.run.options.tensor_core_precision not in MAMBA_PRIOR_EXCLUDED_PRECISIONS
        and c.run.model.num_moe_experts // c.run.layout.ep <= most
    ]


def with_mamba_scan_prior(fitted: dict[str, TimeCoefficients], rows: list[PerfCase]) -> dict[str, TimeCoefficients]:
    """``fitted`` with mamba_scan_flops_per_second set, in every family, to the rate that minimises
    Σ log(predicted / published)² over ``rows`` (one number, within BOUNDS, the other coefficients
    held at ``fitted``); unchanged where ``rows`` is empty or a family of theirs is not fitted."""
    if not rows or any(c.run.hardware.architecture not in fitted for c in rows):
        return fitted

    def loss(log_rate: float) -> float:
        rate = float(10.0**log_rate)
        out = [
            predicted_tflops(
                c, dataclasses.replace(fitted[c.run.hardware.architecture], mamba_scan_flops_per_second=rate)
            )
            / c.published_tflops
            for c in rows
        ]
        return float(np.sum(np.log(out) ** 2))

    low, high = (float(np.log10(b)) for b in BOUNDS["mamba_scan_flops_per_second"])
    rate = float(10.0 ** minimize_scalar(loss, bounds=(low, high), method="bounded").x)
    return {f: dataclasses.replace(c, mamba_scan_flops_per_second=rate) for f, c in fitted.items()}


def family_values(c: TimeCoefficients) -> dict[str, float]:
    """What the coefficients file keeps of a family: every bounded coefficient, plus the BF16
    half-size where it is set (with_bf16_half_size)."""
    values = {n: float(getattr(c, n)) for n in BOUNDS}
    if c.grouped_gemm_half_size_bf16:
        values["grouped_gemm_half_size_bf16"] = float(c.grouped_gemm_half_size_bf16)
    return values


def _fp8_prior_case(cases: list[PerfCase], names: list[str]) -> PerfCase | None:
    """Where fp8_grouped_speedup is not fitted, one FP8-class MoE row of the family's most common
    FP8 recipe: its dense FP8 gain (time.dense_fp8_gain) stands in for the expert GEMMs' gain."""
    if "fp8_grouped_speedup" in names:
        return None
    fp8_moe = [c for c in cases if c.run.model.is_moe and c.run.options.tensor_core_precision in ("fp8", "mxfp8")]
    if not fp8_moe:
        return None
    precisions = [c.run.options.tensor_core_precision for c in fp8_moe]
    common = max(set(precisions), key=precisions.count)
    return next(c for c in fp8_moe if c.run.options.tensor_core_precision == common)


def load_cases() -> list[PerfCase]:
    cases, _ = perf_cases(str(REFERENCE / "perf_summary.csv"), str(REFERENCE / "perf_recipes.csv"))
    long_context, _ = long_context_cases(str(REFERENCE / "long_context.csv"))
    return split_time_holdout(cases)[0] + long_context


@functools.cache
def load_held_out_cases() -> tuple[PerfCase, ...]:
    """The reference perf rows of perf_rows.TIME_HOLDOUT models (read once)."""
    cases, _ = perf_cases(str(REFERENCE / "perf_summary.csv"), str(REFERENCE / "perf_recipes.csv"))
    return tuple(split_time_holdout(cases)[1])


def by_family(cases: list[PerfCase]) -> dict[str, list[PerfCase]]:
    families: dict[str, list[PerfCase]] = {}
    for case in cases:
        families.setdefault(case.run.hardware.architecture, []).append(case)
    return families


def mape(cases: list[PerfCase], fitted: dict[str, TimeCoefficients]) -> float:
    errors = [abs(predicted_tflops(c, fitted[c.run.hardware.architecture]) / c.published_tflops - 1) for c in cases]
    return 100 * float(np.mean(errors)) if errors else 0.0


def leave_one_model_out(
    cases: list[PerfCase], fitted: dict[str, TimeCoefficients]
) -> tuple[float, float, dict[str, dict[str, float]]]:
    """Refit without each model, predict it; prints per-model MAPE, returns the row-weighted
    MAPE over all rows and over the MoE rows, and per model {n, mape, bias_pct} (bias: mean
    signed error). Families a refit has no rows for keep the full fit's coefficients."""
    errors: list[tuple[float, bool]] = []
    per_model: dict[str, dict[str, float]] = {}
    for name in sorted({c.model_name for c in cases}):
        train = [c for c in cases if c.model_name != name]
        held = [c for c in cases if c.model_name == name]
        refit = fitted | fit_families(train)
        signed = [predicted_tflops(c, refit[c.run.hardware.architecture]) / c.published_tflops - 1 for c in held]
        err = 100 * float(np.mean(np.abs(signed)))
        bias = 100 * float(np.mean(signed))
        per_model[name] = {"n": len(held), "mape": err, "bias_pct": bias, "moe": float(held[0].run.model.is_moe)}
        print(f"  leave out {name:30s} n={len(held):3d} MAPE {err:6.2f}%  bias {bias:+6.2f}%", flush=True)
        errors += [(abs(e) * 100, held[0].run.model.is_moe) for e in signed]
    moe = [e for e, is_moe in errors if is_moe]
    return (
        float(np.mean([e for e, _ in errors])) if errors else 0.0,
        float(np.mean(moe)) if moe else 0.0,
        per_model,
    )


def fitted_parameter_count(fitted: dict[str, TimeCoefficients]) -> int:
    """Free numbers of the joint fit (every family shares one vector; fit_families records it)."""
    return max(int(c.fit.get("num_fitted_parameters", 0)) for c in fitted.values())  # type: ignore[call-overload]


def near_bounds(fitted: dict[str, TimeCoefficients], tolerance: float = 0.01) -> list[str]:
    """Fitted coefficients within ``tolerance`` of their bound's span from either bound."""
    out = []
    for family, c in fitted.items():
        for name in c.fit.get("fitted_names", ()):  # type: ignore[attr-defined]
            low, high = family_bounds(family)[name]
            value = getattr(c, name)
            if min(value - low, high - value) <= tolerance * (high - low):
                out.append(f"{family}.{name}={value:.4g} in [{low:.4g}, {high:.4g}]")
    return out


def per_model_mape(cases: list[PerfCase], fitted: dict[str, TimeCoefficients]) -> dict[str, dict[str, float]]:
    """In-sample {n, mape, bias_pct} per model."""
    out = {}
    for name in sorted({c.model_name for c in cases}):
        held = [c for c in cases if c.model_name == name]
        signed = [predicted_tflops(c, fitted[c.run.hardware.architecture]) / c.published_tflops - 1 for c in held]
        out[name] = {
            "n": len(held),
            "mape": 100 * float(np.mean(np.abs(signed))),
            "bias_pct": 100 * float(np.mean(signed)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--lomo", action="store_true", help="also leave-one-model-out (slow)")
    args = parser.parse_args(argv)
    cases = load_cases()
    fitted = fit_families(cases)
    moe = [c for c in cases if c.run.model.is_moe]
    for family, coefficients in fitted.items():
        print(family, {n: round(getattr(coefficients, n), 5) for n in BOUNDS})
        print("  sustained clock vs", REFERENCE_GPUS, {k: round(v, 3) for k, v in coefficients.gpu_clock.items()})
        print(
            "  container factors vs",
            coefficients.fit["reference_container"],
            {k: round(v, 3) for k, v in coefficients.fit["containers"].items()},
        )
    num_fitted = fitted_parameter_count(fitted)
    summary: dict[str, object] = {
        "n": len(cases),
        "n_moe": len(moe),
        "num_fitted_parameters": num_fitted,
        "rows_per_parameter": len(cases) / num_fitted,
        "mape_all": mape(cases, fitted),
        "mape_moe": mape(moe, fitted),
        "per_model": per_model_mape(cases, fitted),
    }
    print(f"fitted parameters {num_fitted}, rows {len(cases)}, rows/parameter {len(cases) / num_fitted:.1f}")
    near = near_bounds(fitted)
    print("coefficients within 1% of a bound:", ", ".join(near) if near else "none")
    print(f"fit MAPE all {summary['mape_all']:.2f}% (n={len(cases)}), MoE {summary['mape_moe']:.2f}% (n={len(moe)})")
    if args.lomo:
        summary["lomo_mape"], summary["lomo_mape_moe"], summary["lomo_per_model"] = leave_one_model_out(cases, fitted)
        print(f"leave-one-model-out MAPE {summary['lomo_mape']:.2f}%, MoE rows {summary['lomo_mape_moe']:.2f}%")
    if args.write:
        payload = {
            "families": {family: family_values(c) for family, c in fitted.items()},
            "gpu_clocks": {family: dict(c.gpu_clock) for family, c in fitted.items()},
            "containers": {family: dict(c.fit["containers"]) for family, c in fitted.items()},
            "reference_containers": {family: c.fit["reference_container"] for family, c in fitted.items()},
            "release_rate_per_month": {f: c.fit.get("release_rate_per_month", 0.0) for f, c in fitted.items()},
            "fit": {
                "date": dt.date.today().isoformat(),
                "script": "benchmarks/fit_time.py",
                "data": ["perf_summary.csv + perf_recipes.csv", "long_context.csv"],
                **summary,
            },
        }
        write_coefficients(OUTPUT, payload, script="benchmarks/fit_time.py")
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
