"""One pipeline stage's microbatch time (forward + backward on one GPU), term by term."""

from __future__ import annotations

from dataclasses import dataclass, fields

from lcmoe.estimate.time.amounts import LayerAmounts, RunAmounts, StageAmounts
from lcmoe.estimate.time.coefficients import TimeCoefficients
from lcmoe.estimate.time.communication import (
    dispatcher_link_efficiency,
    ep_exposed_seconds,
    link_bandwidth,
    scaleout_link_bandwidth,
)
from lcmoe.estimate.time.compute import (
    attention_saturation,
    gdn_kernel_seconds,
    gemm_efficiency,
    gemm_shape_cost,
    grouped_gemm_saturation,
    grouped_peak_flops_per_second,
    narrow_m_factor,
    window_attention_saturation,
)
from lcmoe.estimate.time.host import HOST_SYNCING_DISPATCHERS, exposed_host_seconds, layer_host_seconds
from lcmoe.estimate.time.recompute import recompute_seconds


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
        return {name: getattr(self, name) * factor for name in _STAGE_TIME_TERMS}


# StageTime's term names, in field order (``dataclasses.fields`` is slow on every step estimate).
_STAGE_TIME_TERMS = tuple(f.name for f in fields(StageTime))


@dataclass(frozen=True, slots=True)
class StageRates:
    """The run-wide rates (one GPU) that a stage's amounts are divided by; built by ``stage_rates``."""

    dense_gemm_flops_per_second: float  # peak · clock · GEMM efficiency of the tensor-core kind
    dense_narrow_factor: float  # 1 + m½ / M for the dense GEMMs' M token rows (narrow_m_factor)
    gemm_fixed_seconds: float  # per dense GEMM kernel (GemmShapeCost.fixed_seconds)
    expert_gemm_flops_per_second: float  # grouped peak · clock · efficiency · saturation
    attention_flops_per_second: float  # BF16 peak · clock · efficiency · chunk saturation
    # A sliding-window layer's: the same with the saturation at min(window, chunk)
    # (window_attention_saturation).
    window_attention_flops_per_second: float
    logits_flops_per_second: float  # the output layer: BF16 peak · clock · BF16 GEMM efficiency
    tp_bytes_per_second: float
    cp_bytes_per_second: float
    ep_nvlink_bytes_per_second: float  # NVLink · EP link efficiency of the dispatcher
    ep_network_bytes_per_second: float  # NIC · EP network efficiency of the dispatcher
    pp_bytes_per_second: float  # stages sit in different NVLink domains: the NIC
    # The CP all-to-all's link: the CP group's (cp_bytes_per_second) for a2a; for a2a+p2p its
    # inner group's, tp·a GPUs (NVLink when they sit in one domain).
    cp_a2a_bytes_per_second: float = 0.0


def stage_rates(a: RunAmounts, c: TimeCoefficients) -> StageRates:
    """The rates of ``a`` at coefficients ``c`` (see StageRates' fields for each formula)."""
    clock = c.gpu_clock.get(a.gpu, 1.0)
    shape = gemm_shape_cost(a.architecture, a.tensor_core)
    saturation = grouped_gemm_saturation(a.tokens_per_expert, c, a.expert_gemm_size, bf16=a.tensor_core == "bf16")
    attention_saturated = attention_saturation(a.attention_chunk, c)
    attention_rate = a.bf16_peak_flops_per_second * clock * c.attention_efficiency
    return StageRates(
        dense_gemm_flops_per_second=a.gemm_peak_flops_per_second * clock * gemm_efficiency(a.tensor_core, c),
        dense_narrow_factor=narrow_m_factor(a.dense_gemm_rows, shape),
        gemm_fixed_seconds=shape.fixed_seconds,
        expert_gemm_flops_per_second=grouped_peak_flops_per_second(a, c)
        * clock
        * c.grouped_gemm_efficiency
        * saturation,
        attention_flops_per_second=attention_rate * attention_saturated,
        window_attention_flops_per_second=attention_rate
        * window_attention_saturation(a.attention_chunk, a.attention_window, c),
        logits_flops_per_second=a.bf16_peak_flops_per_second * clock * c.gemm_efficiency_bf16,
        tp_bytes_per_second=link_bandwidth(a, a.tp_span, c),
        cp_bytes_per_second=link_bandwidth(a, a.cp_span, c),
        ep_nvlink_bytes_per_second=a.nvlink_bytes_per_second
        * dispatcher_link_efficiency(c.ep_comm_efficiency, a.dispatcher),
        ep_network_bytes_per_second=a.scaleout_bytes_per_second
        * dispatcher_link_efficiency(c.ep_network_efficiency, a.dispatcher),
        pp_bytes_per_second=scaleout_link_bandwidth(a, c),
        cp_a2a_bytes_per_second=link_bandwidth(a, a.cp_a2a_span or a.cp_span, c),
    )


@dataclass(frozen=True, slots=True)
class LayerSeconds:
    """One layer's seconds per microbatch on one GPU, by term (``layer_seconds``)."""

    dense: float
    experts: float
    attention: float
    scan: float  # Mamba chunked scan + GDN recurrence
    elementwise: float
    recompute: float
    tp: float
    cp: float
    ep: float
    permute: float
    host: float  # host launch time, before exposure
    overhead: float  # the part of ``host`` the step sees

    @property
    def gpu(self) -> float:
        """GPU time of the layer (what the host launches run ahead of)."""
        return (
            self.dense
            + self.experts
            + self.attention
            + self.scan
            + self.elementwise
            + self.recompute
            + self.tp
            + self.cp
            + self.ep
            + self.permute
        )


def attention_rate(g: LayerAmounts, r: StageRates) -> float:
    """The attention-core rate of layer ``g``: the sliding-window one for a windowed layer."""
    return r.window_attention_flops_per_second if g.windowed_attention else r.attention_flops_per_second


def cp_ring_layer_seconds(
    a: RunAmounts, g: LayerAmounts, c: TimeCoefficients, cp_bw: float, attention: float, *, ring: int = 0
) -> float:
    """Exposed CP ring time of a layer: each of the 3·(n − 1) ring steps (forward 1, backward 2)
    exposes max(0, t_kv·(1 − cp_ring_hidden) − t_attention / n / 3), t_kv = KV bytes per step / link,
    n the ring's ranks: ``ring``, else cp (a2a+p2p passes its outer size p: each of its p steps
    computes 1/p of the layer's attention, for a·tokens rows of heads/(tp·a))."""
    n = ring or a.cp
    per_step_comm = g.cp_kv_bytes_per_step / cp_bw * (1.0 - c.cp_ring_hidden)
    return 3 * (n - 1) * max(0.0, per_step_comm - attention / n / 3)


def cp_layer_seconds(
    a: RunAmounts, g: LayerAmounts, c: TimeCoefficients, cp_bw: float, attention: float, *, a2a_bw: float = 0.0
) -> float:
    """CP time of a layer: the all-to-all bytes / its link ``a2a_bw`` (a2a; else ``cp_bw``), else the
    exposed ring, plus a mixer's (GDN, Mamba) own all-to-all. ``a2a+p2p`` pays both: its inner
    group's all-to-all, not overlapped (Transformer Engine waits for it before the ring and before
    returning: ``flash_attn_a2a_communicate``), and the ring over its outer ranks, overlapped with
    each step's attention as the flat ring is (``cp_ring_layer_seconds`` with ``ring`` = p)."""
    if a.cp_a2a:
        cp = g.cp_a2a_bytes / (a2a_bw or cp_bw)
        if a.cp_outer_ring > 1:
            cp += cp_ring_layer_seconds(a, g, c, cp_bw, attention, ring=a.cp_outer_ring)
    elif a.cp > 1:
        cp = cp_ring_layer_seconds(a, g, c, cp_bw, attention)
    else:
        cp = 0.0
    return cp + g.cp_mixer_a2a_bytes / cp_bw


def ep_layer_seconds(a: RunAmounts, g: LayerAmounts, r: StageRates) -> float:
    """EP dispatch + combine of a layer: bytes · NVLink share / NVLink rate + bytes · NIC share / NIC
    rate, then what ``ep_exposed_seconds`` leaves exposed."""
    if not g.ep_bytes:
        return 0.0
    ep = g.ep_bytes * a.ep_local_share / r.ep_nvlink_bytes_per_second
    ep += g.ep_bytes * a.ep_remote_share / r.ep_network_bytes_per_second
    return ep_exposed_seconds(ep, overlap=a.ep_overlap, dispatcher=a.dispatcher)


@dataclass(frozen=True, slots=True)
class LaunchFreeSeconds:
    """The terms of one layer that neither the dispatcher, the CUDA-graph scope nor EP overlap
    changes (``launch_free_seconds``): what the planner's variants of one set of amounts share."""

    dense: float
    experts: float
    attention: float
    scan: float
    elementwise: float
    tp: float
    cp: float
    permute: float
    # dense + experts + attention + scan + elementwise, added in layer_seconds' order (the head of
    # its GPU-time sum, so a variant's sum is the same float).
    compute: float


def launch_free_seconds(a: RunAmounts, g: LayerAmounts, c: TimeCoefficients, r: StageRates) -> LaunchFreeSeconds:
    """The launch-free terms of layer ``g``: each reads amounts of ``g``, rates of ``r`` other than
    the EP ones, and fields of ``a`` that ``relaunched_amounts`` leaves alone (MoE imbalance,
    HBM rate, architecture, the CP exchange), so they are the same for every dispatcher × graph ×
    overlap variant of ``a``."""
    dense = (g.dense_flops + g.linear_flops) * r.dense_narrow_factor / r.dense_gemm_flops_per_second
    dense += g.dense_gemm_kernels * r.gemm_fixed_seconds
    experts = g.expert_flops / r.expert_gemm_flops_per_second * a.moe_imbalance if g.expert_flops else 0.0
    attention = g.attention_flops / attention_rate(g, r)
    scan = g.mamba_scan_flops / c.mamba_scan_flops_per_second
    if g.gdn_token_heads:
        scan += gdn_kernel_seconds(g.gdn_token_heads, a.architecture)
    elementwise = c.elementwise_traffic_factor * g.elementwise_bytes / a.hbm_bytes_per_second
    tp = g.tp_bytes / r.tp_bytes_per_second * (1 - c.tp_overlap_hidden)
    cp = cp_layer_seconds(a, g, c, r.cp_bytes_per_second, attention, a2a_bw=r.cp_a2a_bytes_per_second)
    permute = c.moe_permute_passes * g.moe_token_bytes / a.hbm_bytes_per_second
    compute = dense + experts + attention + scan + elementwise
    return LaunchFreeSeconds(dense, experts, attention, scan, elementwise, tp, cp, permute, compute)


def layer_seconds(
    a: RunAmounts, g: LayerAmounts, c: TimeCoefficients, r: StageRates, base: LaunchFreeSeconds | None = None
) -> LayerSeconds:
    """Every term of one layer: each an amount of ``g`` over a rate of ``r`` (module docstring).
    ``base``: ``launch_free_seconds(a, g, c, r)`` when the caller has it (for a variant of ``a``)."""
    b = base or launch_free_seconds(a, g, c, r)
    ep = ep_layer_seconds(a, g, r)
    recompute = recompute_seconds(
        a, g, r.dense_gemm_flops_per_second, b.dense, b.experts, b.attention, b.elementwise, ep + b.permute, scan=b.scan
    )
    host = layer_host_seconds(a.cuda_graph_scope, g.is_moe, c, a.local_experts, kind=g.kind, has_mlp=g.has_mlp)
    gpu = b.compute + recompute + b.tp + b.cp + ep + b.permute
    # A full-iteration graph cannot contain a device-to-host sync (Megatron requires the
    # static-shape path for it), so no dispatcher blocks the host there.
    host_sync = g.is_moe and a.dispatcher in HOST_SYNCING_DISPATCHERS and "full_iteration" not in a.cuda_graph_scope
    overhead = exposed_host_seconds(host, gpu, host_sync=host_sync)
    return LayerSeconds(
        b.dense, b.experts, b.attention, b.scan, b.elementwise, recompute, b.tp, b.cp, ep, b.permute, host, overhead
    )


def pp_stage_seconds(a: RunAmounts, stage: StageAmounts, r: StageRates, compute: float) -> float:
    """PP send/recv of a stage per microbatch: vpp · bytes / NIC rate; with VPP > 1 only what
    exceeds the stage's ``compute`` (dense, expert, attention, elementwise, recompute) shows."""
    # Interleaved: every microbatch passes each rank once per model chunk, so vpp sends and
    # receives per rank per microbatch (schedules.py forward_backward_pipelining_with_interleaving).
    pp = a.vpp * stage.pp_bytes / r.pp_bytes_per_second if stage.pp_bytes else 0.0
    if a.vpp > 1:
        # Bridge sets overlap_p2p_comm=True whenever VPP > 1 (comm_overlap.py:422-560,
        # megatron-bridge-facts.md §2): each chunk's send/recv runs while the next chunk computes,
        # so only the comm beyond the stage's compute shows.
        pp = max(0.0, pp - compute)
    return pp


def stage_time_key(stage: StageAmounts) -> tuple[object, ...]:
    """What ``stage_time`` reads of a stage: two stages with equal keys (most stages of a PP
    layout: the same layers, no embedding or loss) take the same time, so a step times each key
    once. The rank and the data-parallel and optimizer amounts are the step's, not the stage's."""
    return (stage.groups, stage.counts, stage.logits_flops, stage.pp_bytes)


def stage_time(
    a: RunAmounts,
    stage: StageAmounts,
    c: TimeCoefficients,
    rates: StageRates | None = None,
    bases: dict[int, LaunchFreeSeconds] | None = None,
) -> StageTime:
    """Forward + backward of one microbatch on one GPU of ``stage`` (see the module docstring).
    ``rates``: ``stage_rates(a, c)``, the same for every stage of ``a`` (a caller timing them all
    builds it once). ``bases``: each layer group's ``launch_free_seconds`` by the group's id,
    kept by a caller pricing variants of one set of amounts (``pipeline.SharedPricing``)."""
    r = rates or stage_rates(a, c)
    dense = expert = attention = elementwise = recompute = tp = cp = ep = ovh = permute = 0.0
    for g, count in zip(stage.groups, stage.counts, strict=True):
        base = None
        if bases is not None:
            base = bases.get(id(g))
            if base is None:
                base = bases[id(g)] = launch_free_seconds(a, g, c, r)
        s = layer_seconds(a, g, c, r, base)
        dense += s.dense * count
        expert += s.experts * count
        attention += (s.attention + s.scan) * count  # sequence mixing: attention core and Mamba scan
        elementwise += s.elementwise * count
        recompute += s.recompute * count
        tp += s.tp * count
        cp += s.cp * count
        ep += s.ep * count
        ovh += s.overhead * count
        permute += s.permute * count
    dense += stage.logits_flops / r.logits_flops_per_second
    compute = dense + expert + attention + elementwise + recompute
    return StageTime(
        dense_gemm=dense,
        expert_gemm=expert,
        attention=attention,
        elementwise=elementwise,
        recompute=recompute,
        tp_comm=tp,
        cp_comm=cp,
        ep_comm=ep,
        pp_comm=pp_stage_seconds(a, stage, r, compute),
        overhead=ovh,
        moe_permute=permute,
    )
