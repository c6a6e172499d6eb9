"""Communication: link rates (NVLink inside a domain, the NIC outside it), EP dispatch link shares
under (group-limited) routing, and the EP time exposed beside compute."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lcmoe.estimate.time.coefficients import TimeCoefficients
from lcmoe.specs.model import ModelSpec

if TYPE_CHECKING:
    from lcmoe.estimate.time.amounts import RunAmounts


# EP link efficiency of each token dispatcher relative to DeepEP's, the one ep_comm_efficiency and
# ep_network_efficiency are fitted for: fixed priors, not fitted (Megatron's NCCL all-to-all and
# all-gather dispatchers move one row per token-expert pair through NCCL's generic kernels,
# HybridEP's kernels reach more of the link); a dispatcher not listed counts as ``alltoall``.
DISPATCHER_RELATIVE_EFFICIENCY = {"alltoall": 0.75, "allgather": 0.6, "deepep": 1.0, "hybridep": 1.1}


def dispatcher_link_efficiency(link_efficiency: float, dispatcher: str) -> float:
    """EP link efficiency of a dispatcher: min(1, e_link · DISPATCHER_RELATIVE_EFFICIENCY[dispatcher])."""
    relative = DISPATCHER_RELATIVE_EFFICIENCY.get(dispatcher, DISPATCHER_RELATIVE_EFFICIENCY["alltoall"])
    return min(link_efficiency * relative, 1.0)


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


def link_bandwidth(a: RunAmounts, span: int, c: TimeCoefficients) -> float:
    """NVLink when ``span`` consecutive ranks fit in one NVLink domain, else the scale-out NIC."""
    if span <= a.nvlink_domain:
        return a.nvlink_bytes_per_second * c.nvlink_efficiency
    return scaleout_link_bandwidth(a, c)


def scaleout_link_bandwidth(a: RunAmounts, c: TimeCoefficients) -> float:
    """Bytes/s of the scale-out NIC: its line rate · scaleout_efficiency (what any traffic between
    NVLink domains gets, e.g. PP send/recv between stages)."""
    return a.scaleout_bytes_per_second * c.scaleout_efficiency


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
