"""Step time, tokens/s/GPU, model TFLOP/s/GPU and MFU, from first principles plus a few fitted
efficiencies (how-to-scale-your-model style: every time is an amount over a rate).

Per pipeline stage and microbatch (one GPU's share; the microbatch's work is spread evenly over
the tp·cp GPUs of its stage, and expert work over the same GPUs by symmetry of the EP fold):

    compute  = Σ_layers  FLOPs_kind / (peak_precision · efficiency_kind)
               kinds: dense GEMM, grouped expert GEMM (efficiency rising with tokens per local
               expert), flash attention (rising with the per-rank chunk length), Gated DeltaNet
    elementwise = k · stored-activation bytes / HBM bandwidth   (norms, activations, permutes)
    recompute   = forward cost of every recomputed module again
    comm     = exposed TP (SP all-gather/reduce-scatter), CP (ring p2p hidden behind the
               attention of each ring step, or a2a), EP dispatch/combine (NVLink inside the
               NVLink domain, the NIC outside it; part hidden with EP overlap), PP send/recv
    overhead = host/launch time per layer, mostly removed by CUDA graphs

    step = (M + (pp − 1)/vpp) · t_microbatch(slowest stage)          (1F1B / interleaved bubble)
         + exposed DP/EDP gradient reduce-scatter + parameter all-gather
         + optimizer step (GPU memory-bound, or host Adam + host-link copies for the offloaded part)

Model TFLOP/s/GPU = Bridge's model FLOPs per step (``estimate.flops``) / step / GPUs: the number
users read in their logs. MFU is against the dense BF16 peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from importlib import resources

import yaml

from lcmoe.estimate.flops import flops_per_token, gdn_flops_per_layer, gqa_projection_per_layer, swa_context
from lcmoe.estimate.memory import (
    BF16,
    layer_activation_bytes,
    stage_params_per_gpu,
    token_shape,
)
from lcmoe.estimate.params import AttentionKind, attention_kind
from lcmoe.layout import ParallelLayout, PipelineStage, pipeline_stages
from lcmoe.run import RunConfig
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


@dataclass(frozen=True, slots=True)
class TimeCoefficients:
    """Efficiencies in (0, 1] and a few rates; fitted per hardware family by fit_time.py.

    Fixed values come from kernels-and-links.md (measured ceilings): grouped GEMM and attention
    half-saturation points, link efficiencies, dispatcher efficiencies, EP-overlap share."""

    gemm_efficiency_bf16: float = 0.70
    gemm_efficiency_fp8: float = 0.55
    gemm_efficiency_fp4: float = 0.45
    grouped_gemm_efficiency: float = 0.55
    attention_efficiency: float = 0.55
    layer_overhead_seconds: float = 1.0e-4
    ep_comm_efficiency: float = 0.7
    cp_ring_hidden: float = 0.0
    # Fixed (not fitted), from kernels-and-links.md.
    grouped_gemm_half_tokens: float = 512.0
    attention_half_chunk: float = 512.0
    elementwise_traffic_factor: float = 3.0
    nvlink_efficiency: float = 0.80
    scaleout_efficiency: float = 0.90
    tp_overlap_hidden: float = 0.6
    ep_overlap_hidden: float = 0.4
    dp_exposed_fraction: float = 0.15
    cuda_graph_overhead_saving: float = 0.7
    host_adam_params_per_second: float = 0.6e9
    fit: dict[str, object] = field(default_factory=dict)


_DISPATCHER_RELATIVE = {"alltoall": 0.75, "allgather": 0.6, "deepep": 1.0, "hybridep": 1.1}


@functools.cache
def _shipped() -> dict[str, object]:
    path = resources.files("lcmoe.data").joinpath("time_coefficients.yaml")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return {}


def shipped_time_coefficients(architecture: str) -> TimeCoefficients:
    """The coefficients shipped for a hardware family (hopper, blackwell; ampere uses hopper's)."""
    data = _shipped()
    families = data.get("families", {}) if isinstance(data, dict) else {}
    family = architecture if architecture in families else "hopper"
    values = families.get(family, {}) if isinstance(families, dict) else {}
    known = {f.name for f in fields(TimeCoefficients)} - {"fit"}
    return replace(TimeCoefficients(), **{k: float(v) for k, v in values.items() if k in known},
                   fit=dict(data.get("fit", {})) if isinstance(data, dict) else {})


# ----- per-layer FLOPs (one token, forward + backward, Bridge's conventions) -----------------
@dataclass(frozen=True, slots=True)
class LayerFlops:
    dense_gemm: float
    expert_gemm: float
    attention_core: float
    linear_attention: float
    up_projection: float  # MLA q/kv up-projections (what mla_up_proj recompute replays)
    dense_mlp: float


def layer_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> LayerFlops:
    """The per-layer split of ``estimate.flops`` (same formulas, one layer)."""
    h, e = model.hidden_size, model.glu_factor
    kind = attention_kind(model, layer)
    up = 0.0
    linear = 0.0
    if kind is AttentionKind.MLA:
        n, dn, dr, dv = model.num_attention_heads, model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        rq, rkv = model.q_lora_rank, model.kv_lora_rank
        q_term = rq * (h + n * (dn + dr) + 1) if rq else h * n * (dn + dr)
        kv_term = rkv * (h + n * (dn + dv) + 1) + h * dr
        proj = 6.0 * (q_term + kv_term + n * dv * h)
        up = 6.0 * ((rq or 0) * n * (dn + dr) + rkv * n * (dn + dv))
        core = 6.0 * (seq_len * n * (dn + dr) / 2 + seq_len * n * dv / 2)
    elif kind is AttentionKind.GDN:
        proj, core = 0.0, 0.0
        linear = gdn_flops_per_layer(model)
    else:
        proj = 6.0 * gqa_projection_per_layer(model)
        q = model.head_dim * model.num_attention_heads
        context = 2 * swa_context(model, seq_len) if kind is AttentionKind.SWA else seq_len
        core = 6.0 * q * context
    if model.is_moe_layer(layer):
        mlp_dense = 6.0 * h * e * model.shared_ffn
        experts = 6.0 * h * e * model.expert_ffn * model.moe_router_topk
    else:
        mlp_dense = 6.0 * h * e * model.ffn_hidden_size
        experts = 0.0
    return LayerFlops(proj + mlp_dense, experts, core, linear, up, mlp_dense)


# ----- rates -------------------------------------------------------------------------------
def gemm_rate(hardware: HardwareSpec, options: TrainingOptions, c: TimeCoefficients) -> float:
    """Achieved dense GEMM FLOP/s: peak of the precision's tensor cores × its efficiency."""
    core = options.tensor_core_precision
    efficiency = {"bf16": c.gemm_efficiency_bf16, "fp8": c.gemm_efficiency_fp8, "mxfp8": c.gemm_efficiency_fp8,
                  "nvfp4": c.gemm_efficiency_fp4}[core]
    return hardware.peak(core) * efficiency


def grouped_gemm_saturation(tokens_per_expert: float, c: TimeCoefficients) -> float:
    """n / (n + n½): grouped GEMM efficiency falls when each local expert sees few tokens
    (kernels-and-links.md §2b: ~60% of peak at ≥ 2K tokens/expert, 11–16% at 512 for small N·K)."""
    return tokens_per_expert / (tokens_per_expert + c.grouped_gemm_half_tokens)


def attention_saturation(chunk: float, c: TimeCoefficients) -> float:
    """L / (L + L½) for per-rank chunk length L (FA3 causal: 292 TFLOP/s at 512 → 616 at 16K)."""
    return chunk / (chunk + c.attention_half_chunk)


def link_bandwidth(hardware: HardwareSpec, group_span: int, c: TimeCoefficients) -> float:
    """Effective one-way bytes/s for a collective over ``group_span`` consecutive ranks: NVLink
    when they fit in one NVLink domain, else the scale-out NIC."""
    if group_span <= hardware.nvlink_domain_size:
        return hardware.nvlink_bandwidth * c.nvlink_efficiency
    return hardware.scaleout_bandwidth * c.scaleout_efficiency


# ----- one microbatch on one stage ----------------------------------------------------------
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

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: StageTime) -> StageTime:
        return StageTime(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def scaled(self, factor: float) -> StageTime:
        return StageTime(**{f.name: getattr(self, f.name) * factor for f in fields(self)})


def cp_exposed_seconds(model: ModelSpec, layout: ParallelLayout, hardware: HardwareSpec, tokens: float,
                       attention_seconds: float, c: TimeCoefficients, options: TrainingOptions,
                       layer: int) -> float:
    """CP communication per layer and microbatch, exposed part.

    p2p ring: cp − 1 steps forward (send K,V of T tokens), 2·(cp − 1) backward (K,V and dK,dV);
    each step hides behind that step's attention (attention / cp per step); exposed = Σ max(0,
    comm − compute). a2a: Q, K, V, O re-sharded forward and back, (cp − 1)/cp of the local
    tensor each, not overlapped (TE dot_product_attention docstring; kernels-and-links.md §5)."""
    if layout.cp == 1 or attention_kind(model, layer) is AttentionKind.GDN:
        return 0.0
    if model.multi_latent_attention:
        width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
        q_width = model.num_attention_heads * (model.qk_head_dim + model.qk_pos_emb_head_dim)
    else:
        width = 2 * model.query_groups * model.head_dim
        q_width = model.num_attention_heads * model.head_dim
    bandwidth = link_bandwidth(hardware, layout.tp * layout.cp, c)
    if layout.cp_comm_type in ("a2a", "a2a+p2p"):
        moved = (layout.cp - 1) / layout.cp * tokens * BF16 * (2 * q_width + width) / layout.tp
        return 2 * 2 * moved / bandwidth  # forward and backward, there and back
    kv_bytes = tokens * BF16 * width / layout.tp
    per_step_comm = kv_bytes / bandwidth
    per_step_compute = attention_seconds / layout.cp / 3  # forward share of one ring step
    steps = 3 * (layout.cp - 1)
    # The fitted share hides ring traffic beyond the per-step attention (the published DSV3 CP
    # series stays flat to CP64 over the NIC); see fit_time.py.
    return steps * max(0.0, per_step_comm * (1.0 - c.cp_ring_hidden) - per_step_compute)


def ep_comm_seconds(model: ModelSpec, layout: ParallelLayout, hardware: HardwareSpec, tokens: float,
                    options: TrainingOptions, c: TimeCoefficients) -> float:
    """EP dispatch + combine for one MoE layer and microbatch, forward and backward (4 passes of
    Td·h bytes, Td = T/sp·k·etp tokens per GPU; FP8 dispatch halves the dispatch passes with the
    flex dispatchers). Tokens go to every EP rank evenly, so a share (1 − domain/(ep·etp)) of
    them crosses the NIC when the EP group leaves the NVLink domain (kernels-and-links.md §4)."""
    if layout.ep * layout.etp == 1:
        return 0.0
    sp = layout.tp if layout.sequence_parallel else 1
    td = tokens / sp * model.moe_router_topk * layout.etp * options.moe_token_imbalance
    dispatch_bytes = 1.0 if options.is_fp8 and options.dispatcher in ("deepep", "hybridep") else float(BF16)
    per_pass = td * model.hidden_size
    total = 2 * per_pass * (dispatch_bytes + BF16)
    span = layout.ep * layout.etp
    remote = max(0.0, 1.0 - hardware.nvlink_domain_size / span) * (span - 1) / span if span > 1 else 0.0
    local = (span - 1) / span - remote
    efficiency = c.ep_comm_efficiency * _DISPATCHER_RELATIVE.get(options.dispatcher, 0.75)
    seconds = total * local / (hardware.nvlink_bandwidth * min(efficiency, 1.0))
    seconds += total * remote / (hardware.scaleout_bandwidth * min(efficiency * 1.2, 1.0))
    if options.overlap_moe_expert_parallel_comm:
        seconds *= 1.0 - c.ep_overlap_hidden
    return seconds


def stage_microbatch_time(run: RunConfig, stage: PipelineStage, c: TimeCoefficients) -> StageTime:
    """Forward + backward of one microbatch on one GPU of ``stage``."""
    model, layout, hardware, options = run.model, run.layout, run.hardware, run.options
    shape = token_shape(layout, options)
    tokens_stage = options.seq_len * layout.mbs
    share = 1.0 / (layout.tp * layout.cp)  # this GPU's share of the microbatch's work
    gemm = gemm_rate(hardware, options, c)
    bf16_peak = hardware.peak("bf16")
    chunk = options.seq_len / layout.cp / (2 if layout.cp > 1 else 1)
    attention_rate = bf16_peak * c.attention_efficiency * attention_saturation(chunk, c)
    local_experts = max((model.num_moe_experts or 1) / layout.ep, 1.0)
    sp = layout.tp if layout.sequence_parallel else 1
    tokens_per_expert = shape.tokens / sp * model.moe_router_topk * layout.etp / local_experts
    core_peak = hardware.peak(options.tensor_core_precision)
    expert_rate = core_peak * c.grouped_gemm_efficiency * grouped_gemm_saturation(tokens_per_expert, c)
    hbm = hardware.hbm_bandwidth
    no_recompute = replace(options, recompute_granularity="none", recompute_modules=frozenset())

    total = StageTime()
    layers = list(stage.decoder_layers) + [model.num_layers - 1] * stage.mtp_layers
    for layer in layers:
        f = layer_flops_per_token(model, layer, options.seq_len)
        dense = f.dense_gemm * tokens_stage * share / gemm
        experts = 0.0
        if f.expert_gemm:
            experts = f.expert_gemm * tokens_stage * share / expert_rate * options.moe_token_imbalance
        attention = f.attention_core * tokens_stage * share / attention_rate
        linear = f.linear_attention * tokens_stage * share / gemm
        elementwise = c.elementwise_traffic_factor * layer_activation_bytes(model, layer, shape, no_recompute) / hbm
        tp_comm = 0.0
        if layout.tp > 1:
            moved = 8 * (layout.tp - 1) / layout.tp * shape.tokens * model.hidden_size * BF16
            tp_comm = moved / link_bandwidth(hardware, layout.tp, c) * (1 - c.tp_overlap_hidden)
        cp_comm = cp_exposed_seconds(model, layout, hardware, shape.tokens, attention, c, options, layer)
        is_moe = model.is_moe_layer(layer)
        ep_comm = ep_comm_seconds(model, layout, hardware, shape.tokens, options, c) if is_moe else 0.0
        forward = (dense + experts + attention + linear) / 3
        recompute = recompute_seconds(options, model, f, tokens_stage * share, gemm, forward, elementwise,
                                      attention, ep_comm, is_moe)
        overhead = c.layer_overhead_seconds * (1 - c.cuda_graph_overhead_saving if options.cuda_graph_scope else 1)
        total = total + StageTime(dense_gemm=dense + linear, expert_gemm=experts, attention=attention,
                                  elementwise=elementwise, recompute=recompute, tp_comm=tp_comm,
                                  cp_comm=cp_comm, ep_comm=ep_comm, overhead=overhead)
    if stage.has_loss:
        logits = 6.0 * model.hidden_size * model.padded_vocab_size(layout.tp) * (1 + stage.mtp_layers)
        total = total + StageTime(dense_gemm=logits * tokens_stage * share / (bf16_peak * c.gemm_efficiency_bf16))
    if layout.pp > 1:
        boundary = 2 * shape.tokens * model.hidden_size * BF16 / sp
        total = total + StageTime(pp_comm=boundary / link_bandwidth(hardware, hardware.nvlink_domain_size + 1, c))
    return total


def recompute_seconds(options: TrainingOptions, model: ModelSpec, f: LayerFlops, tokens: float, gemm: float,
                      forward: float, elementwise: float, attention: float, ep_comm: float, is_moe: bool) -> float:
    """The forward cost of recomputed modules, replayed in backward: full recompute replays the
    whole layer (forward compute, elementwise, and the layer's forward EP comm); selective
    replays only the named modules (core_attn: attention forward; mla_up_proj: the up
    projections; mlp: the dense MLP; moe: expert + shared GEMMs and dispatch; moe_act,
    layernorm, shared_experts: their elementwise share)."""
    if options.recompute_granularity == "full":
        return forward + elementwise / 3 + ep_comm / 2
    if options.recompute_granularity != "selective":
        return 0.0
    mods = options.recompute_modules
    extra = 0.0
    if "core_attn" in mods:
        extra += attention / 3
    if "mla_up_proj" in mods and model.multi_latent_attention:
        extra += f.up_projection * tokens / gemm / 3
    if "mlp" in mods and not is_moe:
        extra += f.dense_mlp * tokens / gemm / 3
    if "moe" in mods and is_moe:
        extra += f.expert_gemm * tokens / gemm / 3 + f.dense_mlp * tokens / gemm / 3 + ep_comm / 2
    if "shared_experts" in mods and is_moe:
        extra += f.dense_mlp * tokens / gemm / 3
    for small in ("moe_act", "layernorm"):
        if small in mods:
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
        return {"step_seconds": self.step_seconds, "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
                "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu,
                "breakdown": self.breakdown, "critical_stage": self.critical_stage}


def dp_comm_seconds(run: RunConfig, stage: PipelineStage, c: TimeCoefficients) -> float:
    """Exposed DP/EDP traffic per step: gradient reduce-scatter (grad bytes) and parameter
    all-gather (2 B), (d − 1)/d of each local parameter, mostly overlapped with backward and the
    next forward; the exposed fraction is the last bucket's share (fixed)."""
    layout, hardware = run.layout, run.hardware
    params = stage_params_per_gpu(run.model, layout, stage)
    grad_bytes = 4.0 if run.options.main_grads_dtype == "fp32" else 2.0
    dense_dp = layout.dp * layout.cp
    edp = max(layout.edp, 1)
    moved = params.dense * (grad_bytes + 2) * (dense_dp - 1) / dense_dp + params.expert * (grad_bytes + 2) * (
        edp - 1) / edp
    span = layout.world_size // layout.pp
    return c.dp_exposed_fraction * moved / link_bandwidth(hardware, span, c)


def optimizer_seconds(run: RunConfig, stage: PipelineStage, c: TimeCoefficients) -> float:
    """Adam on the GPU is memory-bound: ~28 B per local parameter shard (read p, g, m, v; write
    p, m, v and the BF16 copy) over HBM. The offloaded fraction runs on the host at the host Adam
    rate plus the gradient (4 B) down and parameter (2 B) up copies over the host link
    (kernels-and-links.md §6; ~0.6 G params/s per GPU rank from the cpu-offloading table)."""
    from lcmoe.estimate.memory import optimizer_shards

    layout, hardware, options = run.layout, run.hardware, run.options
    params = stage_params_per_gpu(run.model, layout, stage)
    dense_shard, expert_shard = optimizer_shards(layout, options)
    local = params.dense / dense_shard + params.expert / expert_shard
    offloaded = local * options.optimizer_offload_fraction
    gpu_part = (local - offloaded) * 28 / hardware.hbm_bandwidth
    host_part = offloaded / c.host_adam_params_per_second + offloaded * 6 / hardware.host_link_bandwidth
    return gpu_part + host_part


def estimate_time(run: RunConfig, coefficients: TimeCoefficients | None = None) -> TimeEstimate:
    """Step time of ``run`` with the shipped (or given) coefficients."""
    c = coefficients or shipped_time_coefficients(run.hardware.architecture)
    layout = run.layout
    stages = pipeline_stages(run.model, layout)
    per_stage = [stage_microbatch_time(run, stage, c) for stage in stages]
    critical = max(range(len(stages)), key=lambda i: per_stage[i].total)
    microbatch = per_stage[critical]
    m = max(layout.num_microbatches, 1)
    bubble_factor = (layout.pp - 1) / layout.vpp if layout.pp > 1 else 0.0
    dp = max(dp_comm_seconds(run, stage, c) for stage in stages)
    optimizer = max(optimizer_seconds(run, stage, c) for stage in stages)
    pipeline = microbatch.scaled(m)
    bubble = microbatch.total * bubble_factor
    step = pipeline.total + bubble + dp + optimizer

    tokens = layout.gbs * run.options.seq_len
    world = layout.world_size
    bridge_flops = flops_per_token(run.model, run.options.seq_len, tp=layout.tp).total * tokens
    tflops = bridge_flops / step / world / 1e12
    breakdown = {f.name: getattr(pipeline, f.name) for f in fields(pipeline)}
    breakdown.update(pipeline_bubble=bubble, dp_comm=dp, optimizer=optimizer)
    return TimeEstimate(
        step_seconds=step,
        tokens_per_sec_per_gpu=tokens / step / world,
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / run.hardware.peak("bf16"),
        breakdown=breakdown,
        critical_stage=stages[critical].rank,
    )
