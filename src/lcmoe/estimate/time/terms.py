"""Hand-checkable time terms: every term of a stage's microbatch and of the step as an amount over a
rate, times a stated factor (``TimeTerm``), for ``lcmoe estimate --explain``.

The terms restate what stage.stage_time and pipeline.combine compute, from the same helpers
(stage_rates, layer_seconds), summed over the stage's layer groups: a stage's terms add up to its
StageTime.total, and each term's ``field`` names the StageTime field (or step part) it belongs to.
Terms whose exposure is not a fixed share (the CP ring hidden behind attention, host launches
hidden behind the GPU, PP send/recv hidden behind the next chunk) state the exposed share as their
factor, computed as exposed / raw seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.estimate.time.amounts import RunAmounts, StageAmounts
from lcmoe.estimate.time.coefficients import TimeCoefficients
from lcmoe.estimate.time.communication import DISPATCH_SM_SHARE, link_bandwidth
from lcmoe.estimate.time.compute import GDN_SECONDS_PER_TOKEN_HEAD
from lcmoe.estimate.time.muon_step import stage_optimizer_seconds
from lcmoe.estimate.time.stage import LayerSeconds, StageRates, cp_ring_layer_seconds, layer_seconds, stage_rates


@dataclass(frozen=True, slots=True)
class TimeTerm:
    """seconds = amount / rate × factor. ``field``: the StageTime field (or step part) it adds to."""

    name: str
    amount: float
    amount_unit: str
    rate: float
    rate_unit: str
    seconds: float
    factor: float = 1.0
    factor_note: str = ""
    field: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "amount": self.amount,
            "amount_unit": self.amount_unit,
            "rate": self.rate,
            "rate_unit": self.rate_unit,
            "factor": self.factor,
            "factor_note": self.factor_note,
            "seconds": self.seconds,
            "field": self.field,
        }


def time_term(
    name: str, amount: float, units: tuple[str, str], rate: float, field: str, factor: float = 1.0, note: str = ""
) -> TimeTerm:
    """A term with seconds = amount / rate × factor (0 when the amount is 0); ``units``: (amount
    unit, rate unit)."""
    seconds = amount / rate * factor if amount else 0.0
    return TimeTerm(name, amount, units[0], rate, units[1], seconds, factor, note, field)


def _share(exposed: float, raw: float) -> float:
    """exposed / raw: the exposed share of a term (0 when nothing is raw)."""
    return exposed / raw if raw else 0.0


def _compute_terms(a: RunAmounts, stage: StageAmounts, c: TimeCoefficients, r: StageRates) -> list[TimeTerm]:
    """Dense / expert GEMMs, attention and the mixers' scans of a stage (sums over its layers)."""
    pairs = list(zip(stage.groups, stage.counts, strict=True))
    flop, per_s = ("FLOP", "FLOP/s")
    narrow = f"narrow-M factor 1 + m½/M at M = {a.dense_gemm_rows:.0f} token rows"
    gdn_rate = 1.0 / GDN_SECONDS_PER_TOKEN_HEAD.get(a.architecture, GDN_SECONDS_PER_TOKEN_HEAD["hopper"])
    return [
        time_term(
            "dense GEMM",
            sum(n * (g.dense_flops + g.linear_flops) for g, n in pairs),
            (flop, per_s),
            r.dense_gemm_flops_per_second,
            "dense_gemm",
            r.dense_narrow_factor,
            narrow,
        ),
        time_term(
            "dense GEMM kernel fixed time",
            sum(n * g.dense_gemm_kernels for g, n in pairs),
            ("kernels", "kernels/s"),
            1.0 / r.gemm_fixed_seconds,
            "dense_gemm",
        ),
        time_term("output layer GEMM", stage.logits_flops, (flop, per_s), r.logits_flops_per_second, "dense_gemm"),
        time_term(
            "expert GEMM",
            sum(n * g.expert_flops for g, n in pairs),
            (flop, per_s),
            r.expert_gemm_flops_per_second,
            "expert_gemm",
            a.moe_imbalance,
            "--moe-imbalance: busiest expert rank's tokens / mean",
        ),
        time_term(
            "attention core",
            sum(n * g.attention_flops for g, n in pairs if not g.windowed_attention),
            (flop, per_s),
            r.attention_flops_per_second,
            "attention",
        ),
        time_term(
            "sliding-window attention core",
            sum(n * g.attention_flops for g, n in pairs if g.windowed_attention),
            (flop, per_s),
            r.window_attention_flops_per_second,
            "attention",
            note=f"kernel saturation at the {a.attention_window:.0f}-token window, not the chunk",
        ),
        time_term(
            "Mamba scan",
            sum(n * g.mamba_scan_flops for g, n in pairs),
            (flop, per_s),
            c.mamba_scan_flops_per_second,
            "attention",
        ),
        time_term(
            "GDN recurrence",
            sum(n * g.gdn_token_heads for g, n in pairs),
            ("token-heads", "token-heads/s"),
            gdn_rate,
            "attention",
        ),
    ]


def _memory_comm_terms(a: RunAmounts, stage: StageAmounts, c: TimeCoefficients, r: StageRates) -> list[TimeTerm]:
    """HBM-bound terms (elementwise, MoE permutes) and the TP and EP terms."""
    pairs = list(zip(stage.groups, stage.counts, strict=True))
    hbm = a.hbm_bytes_per_second
    ep_share = DISPATCH_SM_SHARE.get(a.dispatcher, DISPATCH_SM_SHARE["alltoall"]) if a.ep_overlap else 1.0
    ep_note = "EP overlap: share of SMs the dispatch kernels take from compute" if a.ep_overlap else ""
    b, per_s = ("B", "B/s")
    terms = [
        time_term(
            "elementwise",
            sum(n * g.elementwise_bytes for g, n in pairs),
            (b, per_s),
            hbm,
            "elementwise",
            c.elementwise_traffic_factor,
            "elementwise_traffic_factor: HBM passes over the stored activations",
        ),
        time_term(
            "MoE permute",
            sum(n * g.moe_token_bytes for g, n in pairs),
            (b, per_s),
            hbm,
            "moe_permute",
            c.moe_permute_passes,
            "moe_permute_passes: HBM passes over the routed tokens",
        ),
        time_term(
            "TP comm",
            sum(n * g.tp_bytes for g, n in pairs),
            (b, per_s),
            r.tp_bytes_per_second,
            "tp_comm",
            1 - c.tp_overlap_hidden,
            "exposed share, 1 − tp_overlap_hidden",
        ),
        time_term(
            "EP dispatch+combine, NVLink",
            sum(n * g.ep_bytes * a.ep_local_share for g, n in pairs),
            (b, per_s),
            r.ep_nvlink_bytes_per_second,
            "ep_comm",
            ep_share,
            ep_note,
        ),
        time_term(
            "EP dispatch+combine, NIC",
            sum(n * g.ep_bytes * a.ep_remote_share for g, n in pairs),
            (b, per_s),
            r.ep_network_bytes_per_second,
            "ep_comm",
            ep_share,
            ep_note,
        ),
    ]
    return terms


def _exposed_terms(
    a: RunAmounts, stage: StageAmounts, c: TimeCoefficients, r: StageRates, seconds: list[LayerSeconds]
) -> list[TimeTerm]:
    """CP terms (all-to-all; the ring, exposed by what runs beside it), recompute and host launches."""
    counts = stage.counts
    pairs = list(zip(stage.groups, counts, strict=True))
    mixer = sum(n * g.cp_mixer_a2a_bytes for g, n in pairs)
    terms = [time_term("CP mixer all-to-all", mixer, ("B", "B/s"), r.cp_bytes_per_second, "cp_comm")]
    if a.cp_a2a:
        a2a = sum(n * g.cp_a2a_bytes for g, n in pairs)
        terms.append(time_term("CP all-to-all", a2a, ("B", "B/s"), r.cp_a2a_bytes_per_second, "cp_comm"))
    if (not a.cp_a2a and a.cp > 1) or a.cp_outer_ring > 1:  # the flat ring, or a2a+p2p's outer one
        ring = a.cp_outer_ring or a.cp
        steps = 3 * (ring - 1)
        ring_bytes = sum(n * steps * g.cp_kv_bytes_per_step for g, n in pairs)
        exposed = sum(
            n * cp_ring_layer_seconds(a, g, c, r.cp_bytes_per_second, s.attention, ring=ring)
            for g, n, s in zip(stage.groups, counts, seconds, strict=True)
        )
        share = _share(exposed, ring_bytes / r.cp_bytes_per_second)
        note = f"exposed share of {steps} ring steps after cp_ring_hidden and each step's attention"
        terms.append(
            time_term("CP ring KV exchange", ring_bytes, ("B", "B/s"), r.cp_bytes_per_second, "cp_comm", share, note)
        )
    replay = sum(n * s.recompute for n, s in zip(counts, seconds, strict=True))
    terms.append(time_term("recompute (replayed forward)", replay, ("s", "s/s"), 1.0, "recompute"))
    host = sum(n * s.host for n, s in zip(counts, seconds, strict=True))
    overhead = sum(n * s.overhead for n, s in zip(counts, seconds, strict=True))
    note = "exposed share: all after a dispatcher's host sync, else max(0, host − GPU) per layer"
    terms.append(time_term("host launches", host, ("s", "s/s"), 1.0, "overhead", _share(overhead, host), note))
    return terms


def stage_terms(a: RunAmounts, stage: StageAmounts, c: TimeCoefficients, pp_seconds: float) -> tuple[TimeTerm, ...]:
    """Every term of one microbatch on one GPU of ``stage``; they add up to its StageTime.total.
    ``pp_seconds``: the stage's StageTime.pp_comm (its exposed share is pp_seconds / raw)."""
    r = stage_rates(a, c)
    seconds = [layer_seconds(a, g, c, r) for g in stage.groups]
    pp_bytes = a.vpp * stage.pp_bytes
    pp_note = "VPP > 1: only what exceeds the stage's compute shows" if a.vpp > 1 else ""
    pp_share = _share(pp_seconds, pp_bytes / r.pp_bytes_per_second) if pp_bytes else 1.0
    pp = time_term("PP send/recv", pp_bytes, ("B", "B/s"), r.pp_bytes_per_second, "pp_comm", pp_share, pp_note)
    terms = (
        _compute_terms(a, stage, c, r)
        + _memory_comm_terms(a, stage, c, r)
        + _exposed_terms(a, stage, c, r, seconds)
        + [pp]
    )
    return tuple(t for t in terms if t.amount)


def step_terms(a: RunAmounts, c: TimeCoefficients) -> tuple[TimeTerm, ...]:
    """The step's terms beside the microbatches: exposed DP gradient traffic (the stage with the
    most) and the optimizer step (the stage with the slowest: GPU Adam, host Adam, host-link copies)."""
    dp_bw = link_bandwidth(a, a.dp_span, c)
    dp_stage = max(a.stages, key=lambda s: s.dp_bytes + s.fsdp_bytes)
    optimizer = max(a.stages, key=lambda s: stage_optimizer_seconds(a, s, c))
    terms = (
        time_term(
            "DP/EDP gradient reduce-scatter + all-gather",
            dp_stage.dp_bytes,
            ("B", "B/s"),
            dp_bw,
            "dp_comm",
            c.dp_exposed_fraction,
            "exposed share, dp_exposed_fraction",
        ),
        time_term("optimizer on GPU", optimizer.optimizer_gpu_bytes, ("B", "B/s"), a.hbm_bytes_per_second, "optimizer"),
        time_term(
            "optimizer on host (offloaded)",
            optimizer.optimizer_host_params,
            ("params", "params/s"),
            c.host_adam_params_per_second,
            "optimizer",
        ),
        time_term(
            "optimizer host-link copies",
            optimizer.optimizer_host_bytes,
            ("B", "B/s"),
            a.host_link_bytes_per_second,
            "optimizer",
        ),
    )
    fsdp = time_term(
        "Megatron-FSDP per-microbatch gathers and reduce-scatters",
        dp_stage.fsdp_bytes,
        ("B", "B/s"),
        dp_bw,
        "dp_comm",
        c.dp_exposed_fraction,
        "exposed share, dp_exposed_fraction",
    )
    return tuple(t for t in (*terms, fsdp, *muon_terms(a, optimizer, c)) if t.amount)


def muon_terms(a: RunAmounts, s: StageAmounts, c: TimeCoefficients) -> tuple[TimeTerm, ...]:
    """The Muon step's terms on stage ``s`` (``estimate.muon.muon_step_seconds``): NS GEMMs,
    their TP traffic, the layer-wise all-gather (exposed) and the gradient all-reduce's extra
    half (at the DP exposed share), less the share of the all-gather the DP term charges."""
    m = s.muon
    if m is None:
        return ()
    gemm = a.bf16_peak_flops_per_second * c.gemm_efficiency_bf16
    dp_bw, f = link_bandwidth(a, a.dp_span, c), c.dp_exposed_fraction
    return (
        time_term("Muon Newton-Schulz GEMMs", m.ns_flops, ("FLOP", "FLOP/s"), gemm, "optimizer"),
        time_term("Muon NS TP traffic", m.tp_bytes, ("B", "B/s"), link_bandwidth(a, a.tp_span, c), "optimizer"),
        time_term(
            "Muon layer-wise param all-gather",
            m.param_gather_bytes,
            ("B", "B/s"),
            dp_bw,
            "optimizer",
            1 - f,
            "not overlapped; the DP term has charged dp_exposed_fraction of it",
        ),
        time_term(
            "Muon gradient all-reduce beyond a reduce-scatter",
            m.grad_allreduce_extra_bytes,
            ("B", "B/s"),
            dp_bw,
            "optimizer",
            f,
            "exposed share, dp_exposed_fraction",
        ),
    )
