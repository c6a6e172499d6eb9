"""The Muon optimizer as Megatron-Core 0.19.2 runs it: which matrices it orthogonalises, the
Newton-Schulz (NS) FLOPs and traffic of one optimizer step, per GPU of a pipeline stage.

Sources (pinned releases: megatron-core 0.19.2, megatron-bridge 0.6.2, and the
``emerging_optimizers`` package both import; ``core`` = ``megatron/core``):

* **What Muon owns.** ``core optimizer/emerging_optimizers.py:128-130`` routes every parameter
  tagged ``is_embedding_or_output_parameter`` and every parameter that is not 2-D to the scalar
  optimizer (``muon_scalar_optimizer``, Adam by default, :805-809): the embedding, the output
  layer, norms and biases stay on Adam; every other 2-D weight (attention, MLP, router, shared
  and routed experts, MLA projections, the MTP ``eh_proj``) is orthogonalised. Routed experts are
  tagged ``expert_tp`` (``optimizer/__init__.py:780-782``) and use the expert-TP group.
* **The NS step** (``emerging_optimizers/orthogonalized_optimizers/muon_utils.py``
  ``newton_schulz`` / ``newton_schulz_step``): X is transposed so that it is p×q with
  p = min(m, n), q = max(m, n); each step computes A = X·Xᵀ (2·p²·q FLOPs), B = b·A + c·A·A
  (2·p³) and X ← a·X + B·X (2·p²·q): **4·p²·q + 2·p³ FLOPs per step**, ``muon_num_ns_steps``
  steps (5 by default, the five quintic coefficient sets). Under the default
  ``muon_fp32_matmul_prec="medium"`` X is cast to BF16 first, so the GEMMs run at the BF16 rate.
* **QKV split** (``muon_split_qkv``, default True; emerging_optimizers.py:294-324): a GQA
  ``linear_qkv`` is orthogonalised as three matrices, q (n·d × h), k and v (g·d × h each), plus
  the output gate beside q when the model has one (:138-145); MLA is not split ("TODO support
  MLA", :785), its projections are separate weights anyway.
* **Under TP** (``muon_tp_mode``, default ``blockwise`` in OptimizerConfig and Bridge's
  ``distributed_muon_with_cosine_annealing``; emerging_optimizers.py:290 passes no partition
  dim for it): ``blockwise`` orthogonalises each TP shard on its own, no traffic;
  ``duplicated`` all-gathers the shard's FP32 momentum and runs NS on the full matrix on every
  TP rank (``newton_schulz_tp`` mode "duplicated"); ``distributed`` keeps X sharded along its
  partition dim a (the other, b/t, is local) and all-reduces A (a×a, BF16) over TP every step:
  4·a²·b/t + 2·a³ FLOPs per step. Matrices TE does not split (MLA down projections, the router,
  LatentMoE projections: ``parallel_mode="duplicated"``) are orthogonalised whole, no traffic.
* **Over DP** (layer-wise distributed optimizer, Bridge ``optimizer="dist_muon"``,
  ``optimizer/layer_wise_optimizer.py:632-681``): whole parameters are dealt out to the DP·CP
  ranks (experts to the expert-DP ranks) ping-pong by size, so each rank runs NS only for the
  matrices it owns, about 1/(DP·CP) of the dense and 1/EDP of the expert ones, and keeps their
  master weights and momentum; after the step the owners' updated BF16 parameters are
  all-gathered (``allgather_params``, :736-788) with ``overlap_param_gather`` off, as Bridge's
  Kimi-K2 recipe requires (``recipes/kimi/h100/kimi_k2.py:66-75``), so the gather is exposed.
  Without the layer-wise optimizer (plain ``muon``) every rank holds and updates everything.

Not modelled: the FP32 ``highest`` / TF32 ``high`` matmul precisions (lcmoe emits ``medium``),
the NS workspace (a few copies of the largest local matrix, freed after each one), and the
imbalance of whole-matrix ownership (ping-pong by size keeps every rank within one matrix of the
mean). QK-clip (``model.qk_clip``, Bridge train.py:942-945) is off in every Kimi-K2 recipe
Bridge ships (``perf_recipes/kimi/*/kimi_k2.py``), so lcmoe neither emits nor prices it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from lcmoe.layout import ParallelLayout, PipelineStage
from lcmoe.specs.layer_patterns import AttentionKind
from lcmoe.specs.layers import attention_kind
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions

Split = Literal["column", "row", "none"]
BF16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True, slots=True)
class MuonMatrix:
    """One 2-D weight Muon orthogonalises: ``rows``×``cols`` unsharded (out × in, as TE stores
    it), how TE splits it over (expert-)TP (``column``: rows, ``row``: cols, ``none``: whole on
    every rank) and how many a layer holds (``expert``: one per routed expert)."""

    rows: int
    cols: int
    split: Split
    expert: bool = False


@dataclass(frozen=True, slots=True)
class MuonStepAmounts:
    """One GPU's share of a Muon optimizer step on a pipeline stage."""

    ns_flops: float  # Newton-Schulz FLOPs this rank runs (the matrices it owns)
    tp_bytes: float  # bytes each rank receives over (expert-)TP for NS (duplicated / distributed)
    param_gather_bytes: float  # BF16 parameters received in the layer-wise all-gather
    grad_allreduce_extra_bytes: float  # all-reduce's second half beyond a reduce-scatter


def ns_step_flops(rows: int | float, cols: int | float) -> float:
    """One NS step on a rows×cols matrix: 4·p²·q + 2·p³, p = min, q = max (muon_utils.py
    ``newton_schulz_step``: X·Xᵀ 2p²q, A·A 2p³, B·X 2p²q)."""
    p, q = min(rows, cols), max(rows, cols)
    return 4.0 * p * p * q + 2.0 * p**3


def distributed_ns_step_flops(kept: int | float, split: int | float, tp: int) -> float:
    """One TP-aware NS step (``muon_tp_mode="distributed"``) on a matrix whose ``split`` dim is
    sharded over ``tp`` ranks: X is kept×split/tp, A = X·Xᵀ is kept×kept (all-reduced), so
    4·kept²·split/tp + 2·kept³ per rank (muon_utils.py ``newton_schulz_tp`` sets the transpose
    from the partition dim, so kept may be the longer side: "wastes compute")."""
    return 4.0 * kept * kept * split / tp + 2.0 * kept**3


def _attention_matrices(spec: ModelSpec, kind: AttentionKind) -> Iterator[MuonMatrix]:
    """GQA/SWA: q, [gate,] k, v (split qkv) and the output projection; MLA: q (or q down + up),
    kv down + up, output (multi_latent_attention.py:509-620; down projections are duplicated
    over TP); other mixers (GDN, Mamba, CSA): their weights as one h-wide column-split matrix."""
    h = spec.hidden_size
    if kind is AttentionKind.MLA:
        n, dn, dr, dv = spec.num_attention_heads, spec.qk_head_dim, spec.qk_pos_emb_head_dim, spec.v_head_dim
        if spec.q_lora_rank:
            yield MuonMatrix(spec.q_lora_rank, h, "none")
            yield MuonMatrix(n * (dn + dr), spec.q_lora_rank, "column")
        else:
            yield MuonMatrix(n * (dn + dr), h, "column")
        yield MuonMatrix(spec.kv_lora_rank + dr, h, "none")
        yield MuonMatrix(n * (dn + dv), spec.kv_lora_rank, "column")
        yield MuonMatrix(h, n * dv, "row")
        return
    if kind in (AttentionKind.GQA, AttentionKind.SWA):
        q, kv = spec.num_attention_heads * spec.head_dim, spec.query_groups * spec.head_dim
        for rows in (q, q) if spec.attention_output_gate else (q,):
            yield MuonMatrix(rows, h, "column")
        yield MuonMatrix(kv, h, "column")
        yield MuonMatrix(kv, h, "column")
        yield MuonMatrix(h, q, "row")
        return
    if kind is not AttentionKind.NONE:
        from lcmoe.estimate.params import attention_params

        yield MuonMatrix(max(attention_params(spec, kind) // h, 1), h, "column")


def layer_matrices(spec: ModelSpec, layer: int) -> tuple[MuonMatrix, ...]:
    """The matrices Muon orthogonalises in decoder layer ``layer`` (``spec.mtp_layer`` for an MTP
    layer): attention (``_attention_matrices``), then a dense MLP's fc1 ((glu−1)·ffn × h, column:
    gate and up with a gated unit, ``glu_factor`` counting fc2 too) and fc2 (h × ffn, row), or a
    MoE layer's router (E × h, whole), shared expert, LatentMoE projections (whole) and one
    fc1/fc2 pair per routed expert (expert-TP split)."""
    out = list(_attention_matrices(spec, attention_kind(spec, layer)))
    h, glu = spec.hidden_size, spec.glu_factor - 1  # fc1 rows per ffn unit: gate + up, or up
    if spec.is_moe_layer(layer):
        out.append(MuonMatrix(spec.num_moe_experts or 0, h, "none"))
        if spec.shared_ffn:
            out += [MuonMatrix(glu * spec.shared_ffn, h, "column"), MuonMatrix(h, spec.shared_ffn, "row")]
        if spec.moe_latent_size:
            out += [MuonMatrix(spec.moe_latent_size, h, "none"), MuonMatrix(h, spec.moe_latent_size, "none")]
        d, f = spec.expert_width, spec.expert_ffn
        out += [MuonMatrix(glu * f, d, "column", expert=True), MuonMatrix(d, f, "row", expert=True)]
    elif spec.has_mlp(layer):
        ffn = spec.ffn_hidden_size
        out += [MuonMatrix(glu * ffn, h, "column"), MuonMatrix(h, ffn, "row")]
    return tuple(m for m in out if m.rows and m.cols)


def matrix_step_cost(m: MuonMatrix, tp: int, options: TrainingOptions) -> tuple[float, float]:
    """(NS FLOPs, bytes received over TP) of one matrix on one rank of its TP group of ``tp``:
    ``blockwise`` NS on the local shard; ``duplicated`` an all-gather of the FP32 momentum,
    (tp−1)/tp·m·n·4 B, then NS on the whole matrix; ``distributed`` ``distributed_ns_step_flops``
    with a ring all-reduce of A per step, 2·(tp−1)/tp·kept²·2 B (BF16 under "medium")."""
    steps = options.muon_num_ns_steps
    if m.split == "none" or tp == 1:
        return steps * ns_step_flops(m.rows, m.cols), 0.0
    kept, split = (m.cols, m.rows) if m.split == "column" else (m.rows, m.cols)
    if options.muon_tp_mode == "blockwise":
        return steps * ns_step_flops(kept, split / tp), 0.0
    if options.muon_tp_mode == "duplicated":
        return steps * ns_step_flops(m.rows, m.cols), (tp - 1) / tp * m.rows * m.cols * FP32_BYTES
    traffic = steps * 2 * (tp - 1) / tp * kept * kept * BF16_BYTES
    return steps * distributed_ns_step_flops(kept, split, tp), traffic


def _stage_layers(spec: ModelSpec, stage: PipelineStage) -> Iterator[tuple[int, int]]:
    """(layer, count) of the stage's decoder layers and MTP weight layers."""
    yield from stage.layer_groups
    if stage.mtp_layers:
        yield spec.mtp_layer, min(stage.mtp_layers, spec.mtp_weight_layers)


def stage_ns_cost(
    spec: ModelSpec, layout: ParallelLayout, stage: PipelineStage, options: TrainingOptions
) -> tuple[float, float, float, float]:
    """(dense NS FLOPs, expert NS FLOPs, dense TP bytes, expert TP bytes) of every matrix one
    GPU of the stage holds, before layer-wise ownership divides them: a routed-expert pair per
    local expert (E/EP) over ETP, everything else over TP, plus each MTP layer's eh_proj
    (h × 2h, column; multi_token_prediction.py)."""
    dense_f = expert_f = dense_b = expert_b = 0.0
    local_experts = (spec.num_moe_experts or 0) / layout.ep
    for layer, count in _stage_layers(spec, stage):
        for m in layer_matrices(spec, layer):
            flops, traffic = matrix_step_cost(m, layout.etp if m.expert else layout.tp, options)
            if m.expert:
                expert_f += count * local_experts * flops
                expert_b += count * local_experts * traffic
            else:
                dense_f += count * flops
                dense_b += count * traffic
    if stage.mtp_layers:
        h = spec.hidden_size
        flops, traffic = matrix_step_cost(MuonMatrix(h, 2 * h, "column"), layout.tp, options)
        dense_f += min(stage.mtp_layers, spec.mtp_weight_layers) * flops
        dense_b += min(stage.mtp_layers, spec.mtp_weight_layers) * traffic
    return dense_f, expert_f, dense_b, expert_b


def muon_step_amounts(
    spec: ModelSpec,
    layout: ParallelLayout,
    stage: PipelineStage,
    options: TrainingOptions,
    params: tuple[float, float],
    *,
    shards: tuple[int, int],
) -> MuonStepAmounts | None:
    """One GPU's Muon step on a stage (None unless ``options.optimizer == "muon"``). ``params``:
    the stage's trained (dense, expert) parameters per GPU; ``shards``: the layer-wise
    optimizer's (DP·CP, EDP) owner counts (1, 1 without it). NS FLOPs and TP bytes are
    ``stage_ns_cost`` divided by the owners; the layer-wise all-gather receives
    2·P·(N−1)/N bytes per group of N owners, and DDP without the distributed optimizer
    all-reduces the gradients, g·P·(N−1)/N more than the reduce-scatter lcmoe's DP term counts
    (g = the gradient buffer's bytes per value)."""
    if options.optimizer != "muon":
        return None
    dense_f, expert_f, dense_b, expert_b = stage_ns_cost(spec, layout, stage, options)
    n_dense, n_expert = shards
    gathered = sum(p * (n - 1) / n for p, n in zip(params, shards, strict=True))
    grad_bytes = FP32_BYTES if options.main_grads_dtype == "fp32" else BF16_BYTES
    return MuonStepAmounts(
        ns_flops=dense_f / n_dense + expert_f / n_expert,
        tp_bytes=dense_b / n_dense + expert_b / n_expert,
        param_gather_bytes=BF16_BYTES * gathered,
        grad_allreduce_extra_bytes=grad_bytes * gathered,
    )


def muon_step_seconds(
    amounts: MuonStepAmounts | None,
    *,
    gemm_flops_per_second: float,
    tp_bytes_per_second: float,
    dp_bytes_per_second: float,
    dp_exposed_fraction: float,
) -> tuple[float, float, float]:
    """(NS compute, NS TP traffic, exposed DP traffic) seconds of the step: F_ns / r_gemm (the BF16
    GEMM rate: peak × gemm_efficiency_bf16), B_tp / bw_tp (not overlapped: the optimizer waits for
    it), and B_gather / bw_dp (exposed: no overlap_param_gather) + f·B_allreduce / bw_dp (the
    gradient all-reduce overlaps the backward like the reduce-scatter, exposed share f =
    dp_exposed_fraction) less the f·B_gather the DP term already charges for a distributed
    optimizer's overlapped parameter all-gather."""
    if amounts is None:
        return 0.0, 0.0, 0.0
    ns = amounts.ns_flops / gemm_flops_per_second
    tp = amounts.tp_bytes / tp_bytes_per_second if amounts.tp_bytes else 0.0
    dp_bytes = (1 - dp_exposed_fraction) * amounts.param_gather_bytes
    dp_bytes += dp_exposed_fraction * amounts.grad_allreduce_extra_bytes
    return ns, tp, dp_bytes / dp_bytes_per_second
