"""How many tokens the routed experts' tensors are sized for, and what the MoE paged stash holds
besides: its GPU pages stand in for the stored expert activations, one layer works at the static
budget beside them, and its host pages are pinned host memory.

Megatron-Core 0.19.2 ``transformer/moe/paged_stash.py`` (``ps``): autograd's saved-tensor hooks
move every grouped tensor the fused grouped MLP saves for backward (``on_save_for_backward``,
ps:679-689: only tensors marked ``grouped_tensor_scale_inv``, i.e. the TE op-fuser MLP's FC1
input, FC1 output and FC2 input) into pages of ``moe_paged_stash_page_size`` tokens
(``PagedStashBuffer``, ps:24-122); the pages are allocated once, after a capture step, for
|factor| × the most tokens the schedule keeps in flight at once (``allocate_stash_buffers``,
ps:546-627: positive factors over the expected tokens T·k, the budget ÷ the capacity factor,
experts.py:656-663; negative ones over the capture step's actual tokens).
"""

from __future__ import annotations

from typing import Protocol

from lcmoe.estimate.memory.constants import BF16, FULL_ITERATION_RANK_CAPACITY, FULL_ITERATION_STASH_FACTOR
from lcmoe.layout import PipelineStage
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


class TokenShapeLike(Protocol):
    """What the stash reads of ``activations.TokenShape`` (which imports this module)."""

    @property
    def tokens(self) -> float: ...
    @property
    def sp(self) -> int: ...
    @property
    def etp(self) -> int: ...
    @property
    def stored_gemm_input(self) -> float: ...


def stash_factor(factor: float, imbalance: float) -> float:
    """Tokens a stash buffer holds over the balanced count: ``factor`` when positive (over the
    expected tokens), |factor| × the busiest rank's load when negative (over the capture step's
    actual maximum, which lcmoe's load model puts at ``moe_token_imbalance``)."""
    return factor if factor >= 0 else -factor * imbalance


def expert_token_factor(options: TrainingOptions, *, stored: bool) -> float:
    """What one GPU's routed-expert tensors are sized for, over the balanced T·k tokens:
    - a rank capacity factor c (sync-free HybridEP) sizes the receive buffers for the static
      budget T·k·c (token_dispatcher.py:1090-1100), and so every tensor the fused MLP saves,
      unless the paged stash keeps those (``stored``) in pages for ``stash_factor`` of the
      expected tokens;
    - a full-iteration CUDA graph without explicit options takes Bridge's bundle
      (FULL_ITERATION_STASH_FACTOR for what backward keeps, FULL_ITERATION_RANK_CAPACITY for the
      dispatch buffers) where that is above the load imbalance;
    - otherwise the busiest rank's load, ``moe_token_imbalance`` (dropless, dynamic shapes)."""
    imbalance = options.moe_token_imbalance
    cap = options.moe_expert_rank_capacity_factor
    if cap is not None:
        if stored and options.moe_paged_stash:
            return stash_factor(options.moe_paged_stash_buffer_size_factor_cuda, imbalance)
        return cap
    if "full_iteration" in options.cuda_graph_scope:
        return max(imbalance, FULL_ITERATION_STASH_FACTOR if stored else FULL_ITERATION_RANK_CAPACITY)
    return imbalance


def expert_bytes_per_token(model: ModelSpec, stored_gemm_input: float, etp: int, options: TrainingOptions) -> float:
    """Bytes the routed experts save per dispatched token: FC1 input a·d_e, FC1 output
    2·f·(2 if GLU)/etp, the activation output a·f/etp unless ``moe_act`` is recomputed; none
    when the whole ``moe`` block is (a: ``TokenShape.stored_gemm_input``)."""
    if options.recomputes("moe"):
        return 0.0
    f = model.expert_ffn
    glu = 2 if model.gated_linear_unit else 1
    per_token = stored_gemm_input * model.expert_width + BF16 * f * glu / etp
    if not options.recomputes("moe_act"):
        per_token += stored_gemm_input * f / etp
    return per_token


def balanced_dispatched_tokens(model: ModelSpec, tokens: float, sp: int, etp: int) -> float:
    """T/sp local tokens × top-k, gathered over ETP: one GPU's expert tokens under perfect balance."""
    return tokens / sp * model.moe_router_topk * etp


def stash_working_bytes(options: TrainingOptions, per_token: float, balanced: float) -> float:
    """One MoE layer's expert tensors at the static budget beside the pages: the layer computing
    in forward holds its saved tensors until the copy into the pages completes (``wait_for_stash_
    to_complete``, ps:499-509, at the next layer's start), and the layer in backward gets them back
    at full budget size (``reload_paged_tensors`` allocates ``original_shape``, ps:511-544):
    c·Td·bytes per token, 0 without the stash."""
    cap = options.moe_expert_rank_capacity_factor
    if not options.moe_paged_stash or cap is None:
        return 0.0
    return cap * balanced * per_token


def stash_host_bytes(options: TrainingOptions, per_token: float, balanced: float, moe_layers_in_flight: float) -> float:
    """The pinned host pages (``moe_paged_stash_buffer_size_factor_cpu``, ps:72-79): the host
    factor × the expected tokens of every MoE layer in flight × bytes per token (0: no host pages)."""
    factor = options.moe_paged_stash_buffer_size_factor_cpu
    if not options.moe_paged_stash or factor == 0:
        return 0.0
    return stash_factor(factor, options.moe_token_imbalance) * balanced * per_token * moe_layers_in_flight


def stage_stash_bytes(
    model: ModelSpec, options: TrainingOptions, stage: PipelineStage, shape: TokenShapeLike, copies: float
) -> tuple[float, float]:
    """(GPU bytes of the paged stash's working layer, its pinned host pages) on a stage with MoE
    layers (``copies``: microbatch copies of the stage's layers in flight); (0, 0) without."""
    if not options.moe_paged_stash or not model.is_moe:
        return 0.0, 0.0
    moe_layers = sum(count for first, count in stage.layer_groups if model.is_moe_layer(first))
    moe_layers += stage.mtp_layers if model.is_moe_layer(model.mtp_layer) else 0
    if not moe_layers:
        return 0.0, 0.0
    per_token = expert_bytes_per_token(model, shape.stored_gemm_input, shape.etp, options)
    balanced = balanced_dispatched_tokens(model, shape.tokens, shape.sp, shape.etp)
    working = stash_working_bytes(options, per_token, balanced)
    return working, stash_host_bytes(options, per_token, balanced, copies * moe_layers)
