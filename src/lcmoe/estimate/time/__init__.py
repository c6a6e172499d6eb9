"""Step time, tokens/s/GPU, model TFLOP/s/GPU and MFU, from first principles plus a few fitted
efficiencies (how-to-scale-your-model style: every time is an amount over a rate).

Per pipeline stage and microbatch (one GPU's share; the microbatch's work is spread evenly over
the tp·cp GPUs of its stage, and expert work over the same GPUs by symmetry of the EP fold):

    compute  = Σ_layers  FLOPs_kind / (peak_precision · efficiency_kind)
               kinds: dense GEMM (× 1 + m½/M for M token rows, + a measured fixed time per
               GEMM kernel: GemmShapeCost, from XLA's GEMM grids), grouped expert GEMM
               (efficiency rising with tokens per local expert), flash attention (rising with
               the per-rank chunk length), Gated DeltaNet
    elementwise = k · stored-activation bytes / HBM bandwidth   (norms, activations, permutes)
    recompute   = forward cost of every recomputed module again
    comm     = exposed TP (SP all-gather/reduce-scatter), CP (ring p2p hidden behind the
               attention of each ring step, or a2a), EP dispatch/combine (NVLink inside the
               NVLink domain, the NIC outside it; with EP overlap only the SMs its kernels take
               from the compute beside it: ep_exposed_seconds), PP send/recv
               (hidden behind the next chunk's compute when VPP > 1)
    overhead = host/launch time per layer and per local expert (mostly removed by CUDA graphs)
               where it is exposed:
               the host runs ahead of the GPU, so only host time beyond the layer's GPU time
               shows — except in MoE layers whose dispatcher copies token counts to the host
               (alltoall, allgather, DeepEP), where the GPU idles while the host launches again

    step = (M + (pp − 1)/vpp) · t_microbatch(slowest stage)          (1F1B / interleaved bubble)
         + exposed DP/EDP gradient reduce-scatter + parameter all-gather
         + optimizer step (GPU memory-bound, or host Adam + host-link copies for the offloaded part)

Model TFLOP/s/GPU = Bridge's model FLOPs per step (``estimate.flops``) / step / GPUs: the number
users read in their logs. MFU is against the dense BF16 peak.

Modules: coefficients (TimeCoefficients, bounds, the shipped fit), layer_flops (per-layer FLOPs by
kernel kind), amounts (coefficient-free FLOPs and bytes per layer / stage / run), compute (GEMM,
grouped GEMM, attention, GDN rates), communication (link rates, EP link shares and exposure), host
(launch overheads, CUDA graphs), recompute, stage (one stage's microbatch, term by term), pipeline
(the step), terms (TimeTerm: each term as amount / rate × factor = seconds) and explain (the
terms of one stage and the step they make, for ``estimate --explain``).
"""

from lcmoe.estimate.time.amounts import (
    ADAM_GPU_BYTES_PER_PARAM,
    OFFLOAD_HOST_LINK_BYTES_PER_PARAM,
    LayerAmounts,
    RunAmounts,
    StageAmounts,
    adapter_flops_per_token,
    attention_cp_bytes,
    dense_gemm_kernels,
    dispatch_bytes,
    gemm_passes,
    mixer_cp_a2a_bytes,
    model_flops_per_token,
    moe_layer_bytes,
    time_amounts,
    tp_layer_bytes,
)
from lcmoe.estimate.time.coefficients import (
    COEFFICIENT_BOUNDS,
    SHIPPED_COEFFICIENTS_FILE,
    TimeCoefficients,
    attention_efficiency_on_counted_flops,
    coefficients_from_values,
    shipped_time_coefficients,
)
from lcmoe.estimate.time.communication import (
    DEDUPLICATING_DISPATCHERS,
    DISPATCH_SM_SHARE,
    DISPATCHER_RELATIVE_EFFICIENCY,
    dispatcher_link_efficiency,
    ep_exposed_seconds,
    ep_link_shares,
    link_bandwidth,
    scaleout_link_bandwidth,
    target_hit_probability,
)
from lcmoe.estimate.time.compute import (
    ATTENTION_EFFICIENCY_MEASURED,
    GDN_SECONDS_PER_TOKEN_HEAD,
    GEMM_SHAPE_COSTS,
    GemmShapeCost,
    attention_saturation,
    dense_fp8_gain,
    gdn_kernel_seconds,
    gemm_efficiency,
    gemm_shape_cost,
    grouped_gemm_saturation,
    grouped_peak_flops_per_second,
    narrow_m_factor,
    window_attention_saturation,
)
from lcmoe.estimate.time.explain import TimeExplanation, explain_time
from lcmoe.estimate.time.host import (
    HOST_SYNCING_DISPATCHERS,
    MOE_PREPROCESS_HOST_SHARE,
    MOE_ROUTER_HOST_SHARE,
    exposed_host_seconds,
    graphed_host_shares,
    hybrid_host_units,
    layer_host_seconds,
)
from lcmoe.estimate.time.layer_flops import (
    LayerFlops,
    gdn_recurrence_flops_per_layer,
    gdn_token_heads,
    layer_flops_per_token,
    mamba_gemm_flops_per_layer,
    mamba_scan_flops_per_layer,
)
from lcmoe.estimate.time.pipeline import (
    SharedPricing,
    TimeEstimate,
    combine,
    estimate_time,
    shared_pricing,
)
from lcmoe.estimate.time.recompute import (
    REPLAYED_ELEMENTWISE_SHARE,
    recompute_seconds,
)
from lcmoe.estimate.time.reuse import exchanged_amounts, relaunched_amounts, with_fields
from lcmoe.estimate.time.stage import (
    LayerSeconds,
    StageRates,
    StageTime,
    cp_layer_seconds,
    cp_ring_layer_seconds,
    ep_layer_seconds,
    layer_seconds,
    pp_stage_seconds,
    stage_rates,
    stage_time,
    stage_time_key,
)
from lcmoe.estimate.time.terms import TimeTerm, stage_terms, step_terms, time_term

__all__ = [
    "ADAM_GPU_BYTES_PER_PARAM",
    "ATTENTION_EFFICIENCY_MEASURED",
    "COEFFICIENT_BOUNDS",
    "DEDUPLICATING_DISPATCHERS",
    "DISPATCHER_RELATIVE_EFFICIENCY",
    "DISPATCH_SM_SHARE",
    "GDN_SECONDS_PER_TOKEN_HEAD",
    "GEMM_SHAPE_COSTS",
    "HOST_SYNCING_DISPATCHERS",
    "MOE_PREPROCESS_HOST_SHARE",
    "MOE_ROUTER_HOST_SHARE",
    "OFFLOAD_HOST_LINK_BYTES_PER_PARAM",
    "REPLAYED_ELEMENTWISE_SHARE",
    "SHIPPED_COEFFICIENTS_FILE",
    "GemmShapeCost",
    "LayerAmounts",
    "LayerFlops",
    "LayerSeconds",
    "RunAmounts",
    "SharedPricing",
    "StageAmounts",
    "StageRates",
    "StageTime",
    "TimeCoefficients",
    "TimeEstimate",
    "TimeExplanation",
    "TimeTerm",
    "adapter_flops_per_token",
    "attention_cp_bytes",
    "attention_efficiency_on_counted_flops",
    "attention_saturation",
    "coefficients_from_values",
    "combine",
    "cp_layer_seconds",
    "cp_ring_layer_seconds",
    "dense_fp8_gain",
    "dense_gemm_kernels",
    "dispatch_bytes",
    "dispatcher_link_efficiency",
    "ep_exposed_seconds",
    "ep_layer_seconds",
    "ep_link_shares",
    "estimate_time",
    "exchanged_amounts",
    "explain_time",
    "exposed_host_seconds",
    "gdn_kernel_seconds",
    "gdn_recurrence_flops_per_layer",
    "gdn_token_heads",
    "gemm_efficiency",
    "gemm_passes",
    "gemm_shape_cost",
    "graphed_host_shares",
    "grouped_gemm_saturation",
    "grouped_peak_flops_per_second",
    "hybrid_host_units",
    "layer_flops_per_token",
    "layer_host_seconds",
    "layer_seconds",
    "link_bandwidth",
    "mamba_gemm_flops_per_layer",
    "mamba_scan_flops_per_layer",
    "mixer_cp_a2a_bytes",
    "model_flops_per_token",
    "moe_layer_bytes",
    "narrow_m_factor",
    "pp_stage_seconds",
    "recompute_seconds",
    "relaunched_amounts",
    "scaleout_link_bandwidth",
    "shared_pricing",
    "shipped_time_coefficients",
    "stage_rates",
    "stage_terms",
    "stage_time",
    "stage_time_key",
    "step_terms",
    "target_hit_probability",
    "time_amounts",
    "time_term",
    "tp_layer_bytes",
    "window_attention_saturation",
    "with_fields",
]
