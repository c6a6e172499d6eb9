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
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any

import yaml

from lcmoe.estimate.flops import (
    dsa_layer_flops_per_token,
    expert_gemm_flops_per_moe_layer,
    flops_per_token,
    gdn_flops_per_layer,
    gqa_projection_per_layer,
    latent_projection_flops_per_moe_layer,
    lora_model_flops_per_token,
    mla_core_flops_per_layer,
    mla_projection_flops_per_layer,
    swa_context,
)
from lcmoe.estimate.memory import (
    BF16,
    StagedLayout,
    StageParams,
    layer_activation_bytes,
    stage_trained_params_per_gpu,
    staged_layout,
    token_shape,
)
from lcmoe.estimate.params import LayerSignature, attention_kind, layer_signature, lora_adapters
from lcmoe.layout import PipelineStage
from lcmoe.run import RunConfig
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions


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
    # Mamba-2 chunked-scan throughput on mamba_scan_flops_per_layer's count, an absolute rate
    # shared by every GPU: the SSD kernels (Triton, fp32 state math) scale with neither tensor-core
    # peak nor HBM — the Nemotron-3 rows leave about the same absolute per-token time unexplained
    # on H100 and GB200 without a scan term. Prior: the one public kernel timing found,
    # mamba_chunk_scan_combined forward at B=16, T=8192, 8 heads × 128, N=128, chunk 64: 6.25 ms
    # (fla-org/flash-linear-attention PR #50, GPU not stated) = 16.5 TFLOP/s on this count.
    # Fitted on the Nemotron-3 rows (the only hybrid data).
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
    # (param, grad, m, v read; param, m, v, bf16 copy written), and an H100 DGX host's ~614 GB/s
    # DDR5 over 8 ranks gives a ~2.6 G params/s roofline; torch's CPU Adam reaches ~40% of it.
    # Inside the measured range of kernels-and-links.md §6 (0.3 G/s at 2 threads per rank, ~1.4 G/s
    # DeepSpeed CPU-Adam per host).
    host_adam_params_per_second: float = 1.0e9
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
    "grouped_gemm_efficiency": (0.1, 0.7),
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


_DISPATCHER_RELATIVE = {"alltoall": 0.75, "allgather": 0.6, "deepep": 1.0, "hybridep": 1.1}
# Dispatchers whose device-to-host copy of the per-expert token counts in every MoE layer is
# charged as exposed host time (the all-to-all split sizes; Megatron token_dispatcher.py
# ``cuda_sync_point`` / ``_maybe_dtoh_and_synchronize``; DeepEP normal mode returns
# ``num_recv_tokens_per_expert_list`` to Python). Dropless HybridEP reads its count back as well
# (DeepEP hybrid_ep_buffer.py ``num_dispatched_tokens_tensor.item()``; token_dispatcher.py
# _HybridEPManager: "CPU sync in dispatch" unless moe_expert_rank_capacity_factor gives a static
# budget), but charging it the same contradicts the published HybridEP runs (refit MAPE 5.3% →
# 6.3%, and the DeepEP / alltoall Qwen3-30B H100 rows then +32…+40%): the model keeps HybridEP
# unblocked, an approximation the data supports rather than the code.
HOST_SYNCING_DISPATCHERS = frozenset({"alltoall", "allgather", "deepep"})


# Share of a MoE layer's host launch work (forward + backward) in the router and in the
# dispatcher's preprocess, the two MoE pieces TE-scoped CUDA graphs can capture without static
# expert shapes. Counted from Megatron's MoE forward (moe_layer.py, router.py,
# token_dispatcher.py): of ~37 forward launches, the router (gate GEMM, score function, top-k,
# aux-loss / bias terms) issues ~8 and the preprocess (tokens per expert, splits, row-id map)
# ~6; the rest is permute, dispatch, grouped GEMMs, activation, combine and shared experts.
MOE_ROUTER_HOST_SHARE = 8 / 37
MOE_PREPROCESS_HOST_SHARE = 6 / 37


def graphed_host_shares(scope: frozenset[str], is_moe: bool) -> tuple[float, float]:
    """(share of the non-MoE host work, share of the MoE host work) that ``scope`` captures in
    CUDA graphs (transformer_config.py ``cuda_graph_scope``): ``full_iteration`` all of it;
    ``attn`` the attention block (all non-MoE work of a MoE layer, half of a dense layer's, the
    other half being its MLP, which ``mlp`` captures); ``moe`` the whole MoE block;
    ``moe_router`` / ``moe_preprocess`` their launch shares (MOE_*_HOST_SHARE)."""
    if "full_iteration" in scope:
        return 1.0, 1.0
    dense = 0.0
    if "attn" in scope:
        dense += 1.0 if is_moe else 0.5
    if "mlp" in scope and not is_moe:
        dense += 0.5
    if "moe" in scope:
        moe = 1.0
    else:
        moe = MOE_ROUTER_HOST_SHARE * ("moe_router" in scope) + MOE_PREPROCESS_HOST_SHARE * ("moe_preprocess" in scope)
    return dense, moe if is_moe else 0.0


def hybrid_host_units(scope: frozenset[str], kind: AttentionKind, is_moe: bool) -> tuple[float, float]:
    """(units of t_layer, captured share of them) for a hybrid model's one-block layer: a mixer
    (Mamba, captured by ``mamba``; attention, by ``attn``) or a dense MLP (``mlp``) is half a
    transformer layer's non-MoE host work; a MoE-only layer has none beyond its MoE block."""
    if is_moe:
        return 0.0, 0.0
    graph = "mamba" if kind is AttentionKind.MAMBA else "attn" if kind is not AttentionKind.NONE else "mlp"
    captured = "full_iteration" in scope or graph in scope
    return 0.5, 1.0 if captured else 0.0


def layer_host_seconds(
    scope: frozenset[str],
    is_moe: bool,
    c: TimeCoefficients,
    local_experts: float = 0.0,
    *,
    kind: AttentionKind = AttentionKind.GQA,
    has_mlp: bool = True,
) -> float:
    """Host launch time of one layer, forward + backward: the fitted per-layer (and per-MoE-layer)
    launch time, less what CUDA graphs save on the captured share, plus the per-expert launches
    that only a graph of the experts (``moe``, ``full_iteration``) captures:
    t_layer·u·(1 − s·g_dense) + t_moe·(1 − s·g_moe) + t_expert·E_local·(1 − s·g_experts),
    s = cuda_graph_overhead_saving for per-layer graphs, 1 for a full-iteration graph (the step is
    one graph replay: no Python runs between the captured kernels); u = 1 for a transformer layer,
    hybrid_host_units for a hybrid model's one-block layer."""
    dense_share, moe_share = graphed_host_shares(scope, is_moe)
    units = 1.0
    if kind is AttentionKind.NONE or not has_mlp:
        units, dense_share = hybrid_host_units(scope, kind, is_moe)
    saving = 1.0 if "full_iteration" in scope else c.cuda_graph_overhead_saving
    host = c.layer_overhead_seconds * units * (1 - saving * dense_share)
    if is_moe:
        host += c.moe_layer_overhead_seconds * (1 - saving * moe_share)
        experts_graphed = bool(scope & {"moe", "full_iteration"})
        host += c.expert_host_seconds * local_experts * (1 - saving * experts_graphed)
    return host


def exposed_host_seconds(host: float, gpu: float, *, host_sync: bool) -> float:
    """Host launch time a layer adds to the step. Without a sync the host runs ahead and only its
    excess over the layer's GPU time is exposed: max(0, host − gpu); after a device-to-host sync
    the GPU waits for every launch that follows, so the whole host time is exposed."""
    return host if host_sync else max(0.0, host - gpu)


@functools.cache
def _shipped() -> dict[str, Any]:
    path = resources.files("lcmoe.data").joinpath("time_coefficients.yaml")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return {}


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


# ----- per-layer FLOPs (one token, forward + backward, Bridge's conventions) -----------------
@dataclass(frozen=True, slots=True)
class LayerFlops:
    dense_gemm: float
    expert_gemm: float
    attention_core: float
    linear_attention: float
    up_projection: float  # MLA q/kv up-projections (what mla_up_proj recompute replays)
    dense_mlp: float
    mamba_scan: float = 0.0


def layer_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> LayerFlops:
    """The per-layer split of ``estimate.flops`` (same formulas, one layer). A Mamba mixer counts
    its GEMMs as they run (mamba_gemm_flops_per_layer, not Bridge's 2h count) and its chunked
    scan apart (mamba_scan_flops_per_layer), which runs at its own rate."""
    h, e = model.hidden_size, model.glu_factor
    kind = attention_kind(model, layer)
    up = 0.0
    linear = 0.0
    scan = 0.0
    if kind is AttentionKind.NONE:
        proj, core = 0.0, 0.0
    elif kind is AttentionKind.MAMBA:
        proj, core = mamba_gemm_flops_per_layer(model), 0.0
        scan = mamba_scan_flops_per_layer(model)
    elif kind is AttentionKind.MLA:
        n, dn, dr, dv = model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        rq, rkv = model.q_lora_rank, model.kv_lora_rank
        up = 6.0 * ((rq or 0) * n * (dn + dr) + rkv * n * (dn + dv))
        if model.is_dsa:
            proj, core = dsa_layer_flops_per_token(model, seq_len, indexer=model.has_dsa_indexer(layer))
        else:
            proj, core = mla_projection_flops_per_layer(model), mla_core_flops_per_layer(model, seq_len)
    elif kind is AttentionKind.GDN:
        proj, core = 0.0, 0.0
        # The projections and conv run as GEMMs; the chunked delta-rule recurrence runs at its
        # kernel's measured rate (gdn_kernel_seconds), so its FLOPs leave the GEMM amount.
        linear = gdn_flops_per_layer(model) - gdn_recurrence_flops_per_layer(model)
    else:
        proj = 6.0 * gqa_projection_per_layer(model)
        q = model.head_dim * model.num_attention_heads
        context = 2 * swa_context(model, seq_len) if kind is AttentionKind.SWA else seq_len
        core = 6.0 * q * context
    if model.is_moe_layer(layer):
        # LatentMoE's projections are dense (replicated) GEMMs; its experts work in the latent width.
        mlp_dense = 6.0 * h * e * model.shared_ffn + latent_projection_flops_per_moe_layer(model)
        experts = expert_gemm_flops_per_moe_layer(model)
    elif model.has_mlp(layer):
        mlp_dense = 6.0 * h * e * model.ffn_hidden_size
        experts = 0.0
    else:
        mlp_dense, experts = 0.0, 0.0
    return LayerFlops(proj + mlp_dense, experts, core, linear, up, mlp_dense, scan)


def mamba_gemm_flops_per_layer(model: ModelSpec) -> float:
    """in_proj and out_proj as the mixer runs them: 6·h·(2·d_i + 2·G·N + nh) + 6·d_i·h
    (mamba_mixer.py:281-450)."""
    h = model.hidden_size
    return 6.0 * (h * model.mamba_in_proj_size + model.mamba_inner_size * h)


def gdn_recurrence_flops_per_layer(model: ModelSpec) -> float:
    """The chunked delta-rule part of Bridge's Gated DeltaNet count, 6 · nv · dv² · 4 per token
    (flop_utils.py:1410-1470, the ``nv·dv²·4`` term of gdn_flops_per_layer)."""
    return 6.0 * model.linear_num_value_heads * model.linear_value_head_dim**2 * 4


# Gated DeltaNet chunked kernel (FLA ``chunk_gated_delta_rule``, what Megatron's GDN calls),
# forward + backward seconds per (token × value head) at key and value head dims of 128, once
# T·H ≥ ~0.5 M (below, launch-bound): GB200 ≈ 6.0 ns (fla-org/flash-linear-attention README
# benchmarks: B1 T8192 H96 4.738 ms, B2 T16384 H16 3.616 ms, B4 T4096 H64 5.964 ms;
# kernel-rates-by-shape.md §4a). Hopper has no public forward + backward table; its forward runs
# 1.6× slower than GB200's on the same shape (H800 2.033 ms vs GB200 1.265 ms, B1 T8192 H96,
# PaddlePaddle/flash-attention PR #133), so 9.6 ns.
GDN_SECONDS_PER_TOKEN_HEAD = {"blackwell": 6.0e-9, "hopper": 9.6e-9}


def gdn_token_heads(tokens: float, model: ModelSpec) -> float:
    """(tokens × GDN value heads) in units of a 128 × 128 head state: tokens · nv · dk · dv / 128²
    (the FLA D = 256 row, 16.5 ns, is 2.75× the D = 128 rate for 4× the state, so scaling with
    the state is on the slow side)."""
    state = model.linear_key_head_dim * model.linear_value_head_dim / (128 * 128)
    return tokens * model.linear_num_value_heads * state


def gdn_kernel_seconds(token_heads: float, architecture: str) -> float:
    """Forward + backward time of the GDN recurrence: token_heads (``gdn_token_heads``) ·
    GDN_SECONDS_PER_TOKEN_HEAD of the family (Hopper's for any other)."""
    return token_heads * GDN_SECONDS_PER_TOKEN_HEAD.get(architecture, GDN_SECONDS_PER_TOKEN_HEAD["hopper"])


def mamba_scan_flops_per_layer(model: ModelSpec) -> float:
    """Chunked SSD scan (Dao & Gu 2024, "Transformers are SSMs", §6), per token forward: the
    intra-chunk C·Bᵀ (2·Q·G·N) and its product with X (2·Q·d_i), the chunk states Bᵀ·X and their
    read-out C·state (2·2·N·d_i); ×3 for training. Q = mamba_chunk_size."""
    q, state, d_inner = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_inner_size
    return 3.0 * (2 * q * (model.mamba_num_groups * state + d_inner) + 4 * state * d_inner)


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


def grouped_gemm_saturation(tokens_per_expert: float, c: TimeCoefficients, expert_gemm_size: float = 0.0) -> float:
    """n / (n + n½) · s / (s + s½): grouped GEMM efficiency falls when each local expert sees few
    tokens, and when each expert's GEMM (s = hidden · expert FFN / ETP) is small
    (kernels-and-links.md §2b: ~60% of peak at ≥ 2K tokens/expert, 11–16% at 512 for small N·K)."""
    size = expert_gemm_size / (expert_gemm_size + c.grouped_gemm_half_size) if expert_gemm_size > 0 else 1.0
    return tokens_per_expert / (tokens_per_expert + c.grouped_gemm_half_tokens) * size


def target_hit_probability(model: ModelSpec, targets: int) -> float:
    """Probability that one token's top-k experts include at least one of a given target's,
    where the E experts are split evenly and contiguously over ``targets`` (EP ranks, or NVLink
    domains), under uniform routing (Bridge's perf runs force-balance the router).

    Without group-limited routing: 1 − C(E − E/T, k) / C(E, k). With it (k experts drawn from
    the g = ``moe_router_group_topk`` chosen of G = ``moe_router_num_groups`` contiguous groups,
    DeepSeek-V3's node-limited routing, router.py ``group_limited_topk``): when each target holds
    q = G/T whole groups, the number x of chosen groups on it is hypergeometric (G, q, g) and
    P(hit | x) = 1 − C(Eg − x·E/G, k) / C(Eg, k) with Eg = g·E/G eligible experts; when each group
    spans T/G targets, P = g/G · (1 − C(Eg − E/T, k) / C(Eg, k))."""
    experts, k = model.num_moe_experts or 1, model.moe_router_topk
    if targets <= 1:
        return 1.0
    groups, chosen = model.moe_router_num_groups, model.moe_router_group_topk
    if groups and chosen and chosen < groups and experts % groups == 0:
        eligible = chosen * experts // groups
        if groups % targets == 0:
            per_target = groups // targets
            total = math.comb(groups, chosen)
            miss = 0.0
            for x in range(0, min(per_target, chosen) + 1):
                weight = math.comb(per_target, x) * math.comb(groups - per_target, chosen - x) / total
                miss += weight * math.comb(eligible - x * experts // groups, k) / math.comb(eligible, k)
            return 1.0 - miss
        if targets % groups == 0:
            return chosen / groups * (1.0 - math.comb(eligible - experts // targets, k) / math.comb(eligible, k))
    # No group-limited routing, or groups that do not align with the targets: uniform over all E.
    return 1.0 - math.comb(experts - experts // targets, k) / math.comb(experts, k)


# Dispatchers that send a token once per destination rank (NVLink) and once per destination
# NVLink domain over the NIC, forwarding inside the domain (DeepEP normal-mode intranode and
# internode kernels, deep_ep/buffer.py get_dispatch_layout "is_token_in_rank" / "num_tokens_per_rdma_rank";
# HybridEP's hierarchical dispatch, docs/README_Hybrid-EP.md). Megatron's alltoall and allgather
# dispatchers move one row per (token, expert) pair (token_dispatcher.py MoEAlltoAllTokenDispatcher).
DEDUPLICATING_DISPATCHERS = frozenset({"deepep", "hybridep"})


def ep_link_shares(model: ModelSpec, ep: int, etp: int, domain: int, dispatcher: str) -> tuple[float, float]:
    """Copies of a dispatched token (per top-k slot) that cross NVLink and the NIC, as fractions of
    k: the EP byte amount (2·Td·h·bytes, Td = T·k) times each gives the bytes per link.

    alltoall / allgather (one row per token-expert pair): a slot leaves the rank with
    probability (S − 1)/S for S = EP·ETP ranks, and the NVLink domain with (S − D)/S.
    DeepEP / HybridEP (one copy per distinct destination): NVLink carries (S − 1)·p_rank copies
    (the distinct other ranks, including the forwarding inside remote domains) and the NIC
    (S/D − 1)·p_domain (the distinct other domains), over k; p from target_hit_probability.
    For DeepSeek-V3 at EP32 on H100 (D 8): 2.2 NIC copies instead of 6 — what DeepEP's README
    reports as its "RDMA bottleneck bandwidth" (43–58 GB/s of a 50 GB/s NIC) rather than a
    logical bandwidth above the line rate."""
    span = ep * etp
    if span <= 1:
        return 0.0, 0.0
    if dispatcher not in DEDUPLICATING_DISPATCHERS or not model.is_moe:
        remote = max(0.0, (span - domain) / span)
        return (span - 1) / span - remote, remote
    k = model.moe_router_topk
    nvlink_copies = (ep - 1) * target_hit_probability(model, ep) * etp + (etp - 1)
    domains = max(span // domain, 1)
    network_copies = (domains - 1) * target_hit_probability(model, domains)
    return nvlink_copies / k, network_copies / k


def attention_saturation(chunk: float, c: TimeCoefficients) -> float:
    """L / (L + L½) for per-rank chunk length L (L½ from the cuDNN fwd+bwd sweep, see
    TimeCoefficients.attention_half_chunk)."""
    return chunk / (chunk + c.attention_half_chunk)


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


# ----- amounts (coefficient-free) ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LayerAmounts:
    """One layer of a group of identical layers on a stage: its work per microbatch on one GPU
    (``StageAmounts.counts`` says how many)."""

    dense_flops: float
    expert_flops: float
    attention_flops: float
    linear_flops: float
    up_projection_flops: float
    dense_mlp_flops: float
    elementwise_bytes: float
    tp_bytes: float
    cp_kv_bytes_per_step: float
    cp_a2a_bytes: float
    ep_bytes: float
    moe_token_bytes: float
    is_moe: bool
    cp_mixer_a2a_bytes: float = 0.0  # Mamba's CP all-to-all (whatever cp_comm_type says)
    mamba_scan_flops: float = 0.0
    kind: AttentionKind = AttentionKind.GQA
    has_mlp: bool = True
    # Dense GEMM kernels of the layer per microbatch, every pass (dense_gemm_kernels); each pays
    # GemmShapeCost.fixed_seconds.
    dense_gemm_kernels: float = 0.0
    # (tokens × GDN value heads, gdn_token_heads) of the layer's recurrence on this GPU per microbatch: under CP
    # each rank runs the whole sequence for heads/(TP·CP) heads (Megatron gdn.py a2a_cp_to_hp),
    # the same count as its s/(TP·CP) tokens × all heads.
    gdn_token_heads: float = 0.0


@dataclass(frozen=True, slots=True)
class StageAmounts:
    rank: int
    groups: tuple[LayerAmounts, ...]
    counts: tuple[int, ...]  # layers of each group
    logits_flops: float
    pp_bytes: float
    dp_bytes: float
    optimizer_gpu_bytes: float
    optimizer_host_params: float
    optimizer_host_bytes: float


@dataclass(frozen=True, slots=True)
class RunAmounts:
    """Everything the step time needs that does not depend on fitted coefficients."""

    stages: tuple[StageAmounts, ...]
    gpu: str
    gemm_peak: float
    bf16_peak: float
    tensor_core: str
    hbm_bandwidth: float
    nvlink_bandwidth: float
    scaleout_bandwidth: float
    host_link_bandwidth: float
    tp_span: int
    cp: int
    cp_span: int
    cp_a2a: bool
    ep_local_share: float
    ep_remote_share: float
    dp_span: int
    nvlink_domain: int
    tokens_per_expert: float
    # Rows (tokens) of the dense GEMMs of one microbatch on a GPU: s·b/cp (sequence parallelism
    # gathers the TP group's tokens before each GEMM).
    dense_gemm_rows: float
    expert_gemm_size: float
    local_experts: float
    attention_chunk: float
    dispatcher: str
    ep_overlap: bool
    cuda_graph_scope: frozenset[str]
    recompute_granularity: str
    recompute_modules: frozenset[str]
    moe_imbalance: float
    num_microbatches: int
    pp: int
    vpp: int
    model_flops_per_step: float
    tokens_per_step: float
    world_size: int
    # GEMM passes per layer: forward, data gradient, weight gradient; a frozen (LoRA) base skips
    # the weight gradient (its adapters' GEMMs are counted apart, all three passes).
    gemm_passes: int = 3
    architecture: str = "hopper"


def model_flops_per_token(model: ModelSpec, options: TrainingOptions, tp: int) -> float:
    """The FLOPs per token that TFLOP/s and MFU count: Bridge's training count
    (``estimate.flops``), or its LoRA count under LoRA (``estimate.flops.lora_model_flops_per_token``)."""
    breakdown = flops_per_token(model, options.seq_len, tp=tp)
    return lora_model_flops_per_token(breakdown) if options.is_lora else breakdown.total


def gemm_passes(options: TrainingOptions) -> int:
    """GEMM passes of a trained linear: forward, data gradient and weight gradient (3); a frozen
    LoRA base runs no weight gradient (2)."""
    return 2 if options.is_lora else 3


def adapter_flops_per_token(model: ModelSpec, layer: int, options: TrainingOptions) -> tuple[float, float]:
    """(dense, expert) adapter FLOPs per token of a layer, forward + backward, on the per-layer
    scale of ``layer_flops_per_token`` (a GPU's FLOPs = this × its s·b/(tp·cp) tokens): 6·r·(in +
    out) per dense adapter, × topk for a routed-expert adapter, which every routed token passes
    (as ``expert_gemm_flops_per_moe_layer`` counts the experts). Zero without LoRA."""
    if not options.is_lora:
        return 0.0, 0.0
    dense = expert = 0.0
    for adapter in lora_adapters(model, layer, options.lora_targets):
        flops = 6.0 * adapter.params(options.lora_rank)
        if adapter.expert:
            expert += flops * model.moe_router_topk
        else:
            dense += flops
    return dense, expert


def dense_gemm_kernels(model: ModelSpec, layer: int, passes: int) -> float:
    """Dense GEMM kernels one layer launches per microbatch: its linear layers × ``passes``
    (forward, data gradient, weight gradient). Mixer: GQA/SWA QKV + output (2); MLA the q down/up
    (or one q projection), kv down/up and output (4–5), plus a DSA indexer layer's q and k (2);
    Gated DeltaNet and Mamba in_proj + out_proj (2). MLP: fc1 + fc2 (2); a MoE layer its router
    gate (1), shared expert (2) and LatentMoE's two projections (2). (Megatron's layer specs:
    gpt_layer_specs.py, multi_latent_attention.py, gated_delta_net/gdn.py, mamba_mixer.py,
    moe_layer.py.)"""
    kind = attention_kind(model, layer)
    mixer = 0
    if kind is AttentionKind.MLA:
        mixer = 5 if model.q_lora_rank else 4
        mixer += 2 if model.is_dsa and model.has_dsa_indexer(layer) else 0
    elif kind is not AttentionKind.NONE:
        mixer = 2
    mlp = 0
    if model.is_moe_layer(layer):
        mlp = 1 + 2 * (model.shared_ffn > 0) + 2 * bool(model.moe_latent_size)
    elif model.has_mlp(layer):
        mlp = 2
    return float((mixer + mlp) * passes)


def _layer_amounts(run: RunConfig, layer: int, no_recompute: TrainingOptions) -> LayerAmounts:
    """One layer's amounts (the stage counts its group's layers). ``no_recompute``: the
    run's options without recompute (what the forward touches once)."""
    model, layout, options = run.model, run.layout, run.options
    shape = token_shape(layout, options)
    tokens = options.seq_len * layout.mbs / (layout.tp * layout.cp)  # this GPU's share of the microbatch
    f = layer_flops_per_token(model, layer, options.seq_len)
    is_moe = model.is_moe_layer(layer)
    base_share = gemm_passes(options) / 3
    adapter_dense, adapter_expert = adapter_flops_per_token(model, layer, options)
    kind = attention_kind(model, layer)
    cp_kv = cp_a2a = cp_mixer = 0.0
    if layout.cp > 1 and kind is AttentionKind.GDN:
        # GDN CP is Ulysses-style: in_proj output (q, k, v, z, β, α) all-to-all sequence → heads
        # before the conv + recurrence, and the output back, forward and backward, not overlapped
        # (Megatron-LM gdn.py a2a_cp_to_hp / a2a_hp_to_cp; kernel-rates-by-shape.md §4c).
        qk = model.linear_num_key_heads * model.linear_key_head_dim
        vd = model.linear_num_value_heads * model.linear_value_head_dim
        width = 2 * qk + 2 * vd + 2 * model.linear_num_value_heads + vd
        cp_mixer = 2 * (layout.cp - 1) / layout.cp * shape.tokens * BF16 * width / layout.tp
    if layout.cp > 1 and kind is AttentionKind.MAMBA:
        # Mamba CP trades sequence for heads: all-to-all of the in_proj output before the
        # conv+scan and of its output after, forward and backward (mamba_context_parallel.py).
        width = model.mamba_in_proj_size + model.mamba_inner_size
        cp_mixer = 2 * (layout.cp - 1) / layout.cp * shape.tokens * BF16 * width / layout.tp
    if layout.cp > 1 and kind.is_softmax_attention:
        if model.is_dsa:
            # DSA all-gathers only the latent keys (and an indexer layer's keys), which every TP
            # rank holds whole (dsa.py gather_from_sequence_parallel_region); the exchange is
            # costed like the ring's, per step of its local share.
            width = model.kv_lora_rank + model.qk_pos_emb_head_dim
            width += model.dsa_indexer_head_dim if model.has_dsa_indexer(layer) else 0
            q_width = 0
        elif model.multi_latent_attention:
            width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
            q_width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim)
        else:
            width = 2 * model.query_groups * model.head_dim
            q_width = model.num_attention_heads * model.head_dim
        cp_kv = shape.tokens * BF16 * width / (1 if model.is_dsa else layout.tp)
        cp_a2a = 2 * 2 * (layout.cp - 1) / layout.cp * shape.tokens * BF16 * (2 * q_width + width) / layout.tp
    ep_bytes = 0.0
    routed_tokens = shape.tokens / shape.sp * model.moe_router_topk if is_moe else 0.0
    moe_token_bytes = routed_tokens * model.expert_width * BF16
    if is_moe and layout.ep * layout.etp > 1:
        td = routed_tokens * layout.etp * options.moe_token_imbalance
        dispatch = 1.0 if options.is_fp8 and options.dispatcher in ("deepep", "hybridep") else float(BF16)
        ep_bytes = 2 * td * model.expert_width * (dispatch + BF16)
    # Per block (mixer, MLP): all-gather + reduce-scatter forward and backward.
    blocks = (kind is not AttentionKind.NONE) + model.has_mlp(layer)
    tp_bytes = (
        4 * blocks * (layout.tp - 1) / layout.tp * shape.tokens * model.hidden_size * BF16 if layout.tp > 1 else 0.0
    )
    return LayerAmounts(
        dense_flops=(f.dense_gemm * base_share + adapter_dense) * tokens,
        expert_flops=(f.expert_gemm * base_share + adapter_expert) * tokens,
        attention_flops=f.attention_core * tokens,
        linear_flops=f.linear_attention * base_share * tokens,
        up_projection_flops=f.up_projection * tokens,
        dense_mlp_flops=f.dense_mlp * tokens,
        elementwise_bytes=layer_activation_bytes(model, layer, shape, no_recompute),
        tp_bytes=tp_bytes,
        cp_kv_bytes_per_step=cp_kv,
        cp_a2a_bytes=cp_a2a if layout.cp_comm_type in ("a2a", "a2a+p2p") else 0.0,
        ep_bytes=ep_bytes,
        moe_token_bytes=moe_token_bytes,
        is_moe=is_moe,
        cp_mixer_a2a_bytes=cp_mixer,
        mamba_scan_flops=f.mamba_scan * tokens,
        kind=kind,
        has_mlp=model.has_mlp(layer),
        dense_gemm_kernels=dense_gemm_kernels(model, layer, gemm_passes(options)),
        gdn_token_heads=gdn_token_heads(tokens, model) if kind is AttentionKind.GDN else 0.0,
    )


def _stage_amounts(
    run: RunConfig,
    stage: PipelineStage,
    stage_params: StageParams,
    per_signature: dict[LayerSignature, LayerAmounts],
    no_recompute: TrainingOptions,
) -> StageAmounts:
    """``stage_params``: the stage's parameters per GPU; ``per_signature``: one layer's amounts
    per signature, shared by the run's stages (filled here); ``no_recompute``: the run's options
    without recompute (what a forward touches once)."""
    from lcmoe.estimate.memory import optimizer_shards

    model, layout, options, hardware = run.model, run.layout, run.options, run.hardware
    # MTP layers are transformer layers of the last decoder layer's kind (hybrid: the MTP depth).
    counts = {layer_signature(model, first): [first, count] for first, count in stage.layer_groups}
    if stage.mtp_layers:
        mtp = model.mtp_layer
        counts.setdefault(layer_signature(model, mtp), [mtp, 0])[1] += stage.mtp_layers
    if any(key not in per_signature for key in counts):
        for key, (first, _) in counts.items():
            if key not in per_signature:
                per_signature[key] = _layer_amounts(run, first, no_recompute)
    groups = tuple(per_signature[key] for key in counts)
    group_counts = tuple(count for _, count in counts.values())
    tokens = options.seq_len * layout.mbs / (layout.tp * layout.cp)
    logits = 0.0
    if stage.has_loss:
        passes = 2.0 * gemm_passes(options)
        logits = passes * model.hidden_size * model.padded_vocab_size(layout.tp) * (1 + stage.mtp_layers) * tokens
    shape = token_shape(layout, options)
    pp_bytes = 2 * shape.tokens * model.hidden_size * BF16 / shape.sp if layout.pp > 1 else 0.0
    params = stage_trained_params_per_gpu(model, layout, stage, options, stage_params)
    grad_bytes = 4.0 if options.main_grads_dtype == "fp32" else 2.0
    dense_dp, edp = layout.dp * layout.cp, max(layout.edp, 1)
    dp_bytes = (
        params.dense * (grad_bytes + 2) * (dense_dp - 1) / dense_dp + params.expert * (grad_bytes + 2) * (edp - 1) / edp
    )
    dense_shard, expert_shard = optimizer_shards(layout, options)
    local = params.dense / dense_shard + params.expert / expert_shard
    offloaded = local * options.optimizer_offload_fraction
    del hardware
    return StageAmounts(
        stage.rank, groups, group_counts, logits, pp_bytes, dp_bytes, (local - offloaded) * 28, offloaded, offloaded * 6
    )


def time_amounts(run: RunConfig, staged: StagedLayout | None = None) -> RunAmounts:
    """The coefficient-free amounts of a run: FLOPs by kind and bytes by link, per stage.
    ``staged`` (``staged_layout`` of the run's model and layout) may be passed when the caller
    already has it (the planner does)."""
    model, layout, hardware, options = run.model, run.layout, run.hardware, run.options
    shape = token_shape(layout, options)
    local_experts = max((model.num_moe_experts or 1) / layout.ep, 1.0)
    local, remote = ep_link_shares(model, layout.ep, layout.etp, hardware.nvlink_domain_size, options.dispatcher)
    tokens = layout.gbs * options.seq_len
    per_signature: dict[LayerSignature, LayerAmounts] = {}
    no_recompute = replace(options, recompute_granularity="none", recompute_modules=frozenset())
    staged = staged or staged_layout(model, layout)
    return RunAmounts(
        stages=tuple(
            _stage_amounts(run, stage, params, per_signature, no_recompute)
            for stage, params in zip(staged.stages, staged.params, strict=True)
        ),
        gpu=hardware.name,
        gemm_peak=hardware.peak(options.tensor_core_precision),
        bf16_peak=hardware.peak("bf16"),
        tensor_core=options.tensor_core_precision,
        hbm_bandwidth=hardware.hbm_bandwidth,
        nvlink_bandwidth=hardware.nvlink_bandwidth,
        scaleout_bandwidth=hardware.scaleout_bandwidth,
        host_link_bandwidth=hardware.host_link_bandwidth,
        tp_span=layout.tp,
        cp=layout.cp,
        cp_span=layout.tp * layout.cp,
        cp_a2a=layout.cp_comm_type in ("a2a", "a2a+p2p"),
        ep_local_share=local,
        ep_remote_share=remote,
        dp_span=layout.world_size // layout.pp,
        nvlink_domain=hardware.nvlink_domain_size,
        tokens_per_expert=shape.tokens / shape.sp * model.moe_router_topk * layout.etp / local_experts,
        dense_gemm_rows=options.seq_len * layout.mbs / layout.cp,
        expert_gemm_size=model.expert_width * model.expert_ffn / layout.etp if model.is_moe else 0.0,
        local_experts=local_experts if model.is_moe else 0.0,
        attention_chunk=options.seq_len / layout.cp / (2 if layout.cp > 1 else 1),
        dispatcher=options.dispatcher,
        ep_overlap=options.overlap_moe_expert_parallel_comm,
        cuda_graph_scope=frozenset(options.cuda_graph_scope),
        recompute_granularity=options.recompute_granularity,
        recompute_modules=options.recompute_modules,
        moe_imbalance=options.moe_token_imbalance,
        num_microbatches=max(layout.num_microbatches, 1),
        pp=layout.pp,
        vpp=layout.vpp,
        model_flops_per_step=model_flops_per_token(model, options, layout.tp) * tokens,
        tokens_per_step=tokens,
        world_size=layout.world_size,
        gemm_passes=gemm_passes(options),
        architecture=hardware.architecture,
    )


# ----- rates applied to amounts ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageTime:
    """Seconds for one microbatch (forward + backward) on one GPU of a stage, by term."""

    dense_gemm: float = 0.0
    expert_gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    pp_comm: float = 0.0
    overhead: float = 0.0
    moe_permute: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.moe_permute
            + self.dense_gemm
            + self.expert_gemm
            + self.attention
            + self.elementwise
            + self.recompute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.overhead
        )

    def as_dict(self, factor: float = 1.0) -> dict[str, float]:
        return {f.name: getattr(self, f.name) * factor for f in fields(self)}


def _bandwidth(a: RunAmounts, span: int, c: TimeCoefficients) -> float:
    """NVLink when ``span`` consecutive ranks fit in one NVLink domain, else the scale-out NIC."""
    if span <= a.nvlink_domain:
        return a.nvlink_bandwidth * c.nvlink_efficiency
    return a.scaleout_bandwidth * c.scaleout_efficiency


def _gemm_efficiency(tensor_core: str, c: TimeCoefficients) -> float:
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
    return a.gemm_peak * _gemm_efficiency(a.tensor_core, c) / (a.bf16_peak * c.gemm_efficiency_bf16)


def _grouped_peak(a: RunAmounts, c: TimeCoefficients) -> float:
    """The peak expert GEMMs are measured against: BF16's, × fp8_grouped_speedup for FP8-class
    (capped at the FP8 peak); NVFP4 at its own peak."""
    if a.tensor_core in ("fp8", "mxfp8"):
        return min(a.bf16_peak * c.fp8_grouped_speedup, a.gemm_peak)
    return a.gemm_peak


# Share of the GPU's SMs a dispatcher's communication kernels hold while they run beside compute:
# DeepEP's default Buffer.num_sms = 20 (deep_ep/buffer.py) of H100's 132; HybridEP at the perf
# recipes' moe_hybridep_num_sms = 32 (perf_recipes.csv) of B200's 148; NCCL all-to-all on its
# default 16 channels (one SM each; NCCL_MIN/MAX_NCHANNELS) of 132.
DISPATCH_SM_SHARE = {"deepep": 20 / 132, "hybridep": 32 / 148, "alltoall": 16 / 132, "allgather": 16 / 132}


def ep_exposed_seconds(ep_seconds: float, *, overlap: bool, dispatcher: str = "alltoall") -> float:
    """EP dispatch + combine time a layer adds: all of it without overlap; with
    ``overlap_moe_expert_parallel_comm`` only the compute it slows, σ · t_ep. Megatron's a2a-overlap
    schedule runs the forward of one microbatch beside the backward of another, layer by layer,
    with each one's dispatch/combine on its own stream under the other's attention and expert
    GEMMs (megatron/core/pipeline_parallel/combined_1f1b.py; Megatron-Core MoE README "EP A2A
    overlap"; DeepSeek-V3's DualPipe, arXiv 2412.19437 §3.2.1), so the transfer itself is hidden;
    while it runs, the compute loses the SMs the dispatch kernels hold (σ = DISPATCH_SM_SHARE).
    Replaces a fitted hidden share that sat at its bound (0.99999): the published overlap runs
    show no exposed transfer. A variant exposing max(0, t_ep − t_compute) as well fitted worse
    (in-sample MAPE 6.0% vs 5.35%; Qwen3-235B LOMO 14.9%)."""
    if not overlap:
        return ep_seconds
    return DISPATCH_SM_SHARE.get(dispatcher, DISPATCH_SM_SHARE["alltoall"]) * ep_seconds


def stage_time(a: RunAmounts, stage: StageAmounts, c: TimeCoefficients) -> StageTime:
    """Forward + backward of one microbatch on one GPU of ``stage`` (see the module docstring)."""
    clock = c.gpu_clock.get(a.gpu, 1.0)
    gemm = a.gemm_peak * clock * _gemm_efficiency(a.tensor_core, c)
    shape = gemm_shape_cost(a.architecture, a.tensor_core)
    dense_narrow = narrow_m_factor(a.dense_gemm_rows, shape)
    saturation = grouped_gemm_saturation(a.tokens_per_expert, c, a.expert_gemm_size)
    expert_rate = _grouped_peak(a, c) * clock * c.grouped_gemm_efficiency * saturation
    attention_rate = a.bf16_peak * clock * c.attention_efficiency * attention_saturation(a.attention_chunk, c)
    tp_bw = _bandwidth(a, a.tp_span, c)
    cp_bw = _bandwidth(a, a.cp_span, c)
    ep_eff = min(c.ep_comm_efficiency * _DISPATCHER_RELATIVE.get(a.dispatcher, 0.75), 1.0)
    totals = dict.fromkeys(
        ("dense", "expert", "attention", "elementwise", "recompute", "tp", "cp", "ep", "ovh", "permute"), 0.0
    )
    for g, count in zip(stage.groups, stage.counts, strict=True):
        dense = (g.dense_flops + g.linear_flops) * dense_narrow / gemm + g.dense_gemm_kernels * shape.fixed_seconds
        experts = g.expert_flops / expert_rate * a.moe_imbalance if g.expert_flops else 0.0
        attention = g.attention_flops / attention_rate
        scan = g.mamba_scan_flops / c.mamba_scan_flops_per_second
        if g.gdn_token_heads:
            scan += gdn_kernel_seconds(g.gdn_token_heads, a.architecture)
        elementwise = c.elementwise_traffic_factor * g.elementwise_bytes / a.hbm_bandwidth
        tp = g.tp_bytes / tp_bw * (1 - c.tp_overlap_hidden)
        if a.cp_a2a:
            cp = g.cp_a2a_bytes / cp_bw
        elif a.cp > 1:
            per_step_comm = g.cp_kv_bytes_per_step / cp_bw * (1.0 - c.cp_ring_hidden)
            cp = 3 * (a.cp - 1) * max(0.0, per_step_comm - attention / a.cp / 3)
        else:
            cp = 0.0
        cp += g.cp_mixer_a2a_bytes / cp_bw
        ep = 0.0
        if g.ep_bytes:
            ep = g.ep_bytes * a.ep_local_share / (a.nvlink_bandwidth * ep_eff)
            network_eff = min(c.ep_network_efficiency * _DISPATCHER_RELATIVE.get(a.dispatcher, 0.75), 1.0)
            ep += g.ep_bytes * a.ep_remote_share / (a.scaleout_bandwidth * network_eff)
            ep = ep_exposed_seconds(ep, overlap=a.ep_overlap, dispatcher=a.dispatcher)
        permute = c.moe_permute_passes * g.moe_token_bytes / a.hbm_bandwidth
        recompute = recompute_seconds(a, g, gemm, dense, experts, attention, elementwise, ep + permute, scan=scan)
        host = layer_host_seconds(a.cuda_graph_scope, g.is_moe, c, a.local_experts, kind=g.kind, has_mlp=g.has_mlp)
        gpu = dense + experts + attention + scan + elementwise + recompute + tp + cp + ep + permute
        # A full-iteration graph cannot contain a device-to-host sync (Megatron requires the
        # static-shape path for it), so no dispatcher blocks the host there.
        host_sync = g.is_moe and a.dispatcher in HOST_SYNCING_DISPATCHERS and "full_iteration" not in a.cuda_graph_scope
        overhead = exposed_host_seconds(host, gpu, host_sync=host_sync)
        for key, value in (
            ("dense", dense),
            ("expert", experts),
            ("attention", attention + scan),  # sequence mixing: attention core and Mamba scan
            ("elementwise", elementwise),
            ("recompute", recompute),
            ("tp", tp),
            ("cp", cp),
            ("ep", ep),
            ("ovh", overhead),
            ("permute", permute),
        ):
            totals[key] += value * count
    totals["dense"] += stage.logits_flops / (a.bf16_peak * clock * c.gemm_efficiency_bf16)
    # Interleaved: every microbatch passes each rank once per model chunk, so vpp sends and
    # receives per rank per microbatch (schedules.py forward_backward_pipelining_with_interleaving).
    pp = a.vpp * stage.pp_bytes / _bandwidth(a, a.nvlink_domain + 1, c) if stage.pp_bytes else 0.0
    if a.vpp > 1:
        # Bridge sets overlap_p2p_comm=True whenever VPP > 1 (comm_overlap.py:422-560,
        # megatron-bridge-facts.md §2): each chunk's send/recv runs while the next chunk computes,
        # so only the comm beyond the stage's compute shows.
        pp = max(0.0, pp - sum(totals[k] for k in ("dense", "expert", "attention", "elementwise", "recompute")))
    return StageTime(
        dense_gemm=totals["dense"],
        expert_gemm=totals["expert"],
        attention=totals["attention"],
        elementwise=totals["elementwise"],
        recompute=totals["recompute"],
        tp_comm=totals["tp"],
        cp_comm=totals["cp"],
        ep_comm=totals["ep"],
        pp_comm=pp,
        overhead=totals["ovh"],
        moe_permute=totals["permute"],
    )


def recompute_seconds(
    a: RunAmounts,
    g: LayerAmounts,
    gemm: float,
    dense: float,
    experts: float,
    attention: float,
    elementwise: float,
    ep: float,
    *,
    scan: float = 0.0,
) -> float:
    """The forward cost of recomputed modules, replayed in backward: full recompute replays the
    whole layer (forward compute, elementwise, and the layer's forward EP comm); selective
    replays only the named modules (core_attn: attention forward; mla_up_proj: the up
    projections; mlp: the dense MLP; moe: expert + shared GEMMs and dispatch; moe_act,
    layernorm: their elementwise share, where the module exists)."""
    forward = (dense + experts) / a.gemm_passes + (attention + scan) / 3
    if a.recompute_granularity == "full":
        return forward + elementwise / 3 + ep / 2
    if a.recompute_granularity != "selective":
        return 0.0
    mods = a.recompute_modules
    extra = 0.0
    if "core_attn" in mods:
        extra += attention / 3
    if "mla_up_proj" in mods:
        extra += g.up_projection_flops / gemm / 3
    if "mlp" in mods and not g.is_moe:
        extra += g.dense_mlp_flops / gemm / 3
    if "moe" in mods and g.is_moe:
        extra += experts / a.gemm_passes + g.dense_mlp_flops / gemm / 3 + ep / 2
    if "shared_experts" in mods and g.is_moe:
        extra += g.dense_mlp_flops / gemm / 3
    if "moe_act" in mods and g.is_moe:
        extra += 0.1 * elementwise / 3
    # Only a standalone norm is replayed: MLA's input norm and the MoE pre-MLP norm (the others
    # are fused into the next GEMM and never checkpointed; memory.norm_bytes).
    if "layernorm" in mods and (g.is_moe or g.up_projection_flops > 0):
        extra += 0.1 * elementwise / 3
    return extra


# ----- the step ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TimeEstimate:
    step_seconds: float
    tokens_per_sec_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    breakdown: dict[str, float]
    critical_stage: int

    def as_dict(self) -> dict[str, object]:
        return {
            "step_seconds": self.step_seconds,
            "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "breakdown": self.breakdown,
            "critical_stage": self.critical_stage,
        }


def combine(a: RunAmounts, c: TimeCoefficients) -> TimeEstimate:
    """Step time from amounts and rates: (M + bubble) × slowest stage + exposed DP + optimizer."""
    per_stage = [stage_time(a, stage, c) for stage in a.stages]
    critical = max(range(len(per_stage)), key=lambda i: per_stage[i].total)
    microbatch = per_stage[critical]
    bubble_factor = (a.pp - 1) / a.vpp if a.pp > 1 else 0.0
    dp_bw = _bandwidth(a, a.dp_span, c)
    dp = max(c.dp_exposed_fraction * s.dp_bytes / dp_bw for s in a.stages)
    optimizer = max(
        s.optimizer_gpu_bytes / a.hbm_bandwidth
        + s.optimizer_host_params / c.host_adam_params_per_second
        + s.optimizer_host_bytes / a.host_link_bandwidth
        for s in a.stages
    )
    bubble = microbatch.total * bubble_factor
    step = microbatch.total * a.num_microbatches + bubble + dp + optimizer
    tflops = a.model_flops_per_step / step / a.world_size / 1e12
    breakdown = microbatch.as_dict(a.num_microbatches)
    breakdown.update(pipeline_bubble=bubble, dp_comm=dp, optimizer=optimizer)
    return TimeEstimate(
        step_seconds=step,
        tokens_per_sec_per_gpu=a.tokens_per_step / step / a.world_size,
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / a.bf16_peak,
        breakdown=breakdown,
        critical_stage=a.stages[critical].rank,
    )


def estimate_time(
    run: RunConfig, coefficients: TimeCoefficients | None = None, *, staged: StagedLayout | None = None
) -> TimeEstimate:
    """Step time of ``run`` with the shipped (or given) coefficients (``staged``: see
    ``time_amounts``)."""
    c = coefficients or shipped_time_coefficients(run.hardware.architecture)
    return combine(time_amounts(run, staged), c)
