"""Delayed weight-gradient rules (``delay_wgrad_compute``): what Megatron-Core and Bridge refuse
with it.

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2 ``transformer/
transformer_config.py`` (``mcore``) and ``training/arguments.py`` (``megatron-lm``), megatron-bridge
0.6.2 ``training/comm_overlap.py`` (``bridge``). The checks lcmoe's options cannot break are named
here and kept out of the table:

* the Transformer Engine version gates: TE ≥ 2.7 with ``overlap_grad_reduce`` or
  ``gradient_accumulation_fusion`` (bridge :519-529), TE ≥ 2.8 with ``overlap_grad_reduce`` and
  TE ≥ 2.7 without ``gradient_accumulation_fusion`` (megatron-lm :1822-1852), TE ≥ 2.10 with TE
  CUDA graphs (mcore :2753-2757), TE ≥ 2.12 with the wgrad inside a graph (bridge :537-548). lcmoe
  has no TE-version input: the NeMo container that ships Bridge 0.6.2 meets them;
* ``transformer_impl == "transformer_engine"`` (megatron-lm :1823-1824): every lcmoe config uses TE;
* ``gradient_accumulation_fusion`` with the wgrad inside a graph (bridge :549-552, megatron-lm
  :1838-1841): lcmoe never turns the fusion off (Bridge defaults it on where the fused kernel is
  installed, ``gpt_provider.py:205``; Megatron-LM defaults it on);
* ``overlap_dispatch_backward_with_experts_wgrad`` excludes it (mcore :2759-2771): never emitted.

Time: none, by the model lcmoe prices EP overlap with. Megatron's a2a-overlap layer step
(mcore ``models/common/model_chunk_schedule_plan.py:222-292``) runs, on the comm stream,
combine_bwd | dispatch_fwd → dispatch_bwd | combine_fwd beside, on the compute stream,
attention_fwd | mlp_bwd → mlp_bwd_dw → mlp_fwd | attention_bwd. Delaying the wgrad lets
dispatch_bwd start after the experts' dgrad and run beside their wgrad (``mlp.backward_dw``,
:265), and the next layer's combine_bwd run beside this layer's attention wgrad (:286-289): the
backward's transfers get the wgrad half of the backward GEMMs as more compute to hide behind.
``estimate.time.communication.ep_exposed_seconds`` already prices an overlapped transfer as
wholly hidden (only the SMs its kernels take, σ · t_ep, slow the compute), so there is no
exposed transfer left for a longer window to hide: Δt = 0. That agrees with the one published
A/B (MoE optimisation guide, Qwen3-30B, alltoall EP16 across nodes: EP overlap 31.31 s →
with delayed wgrad 31.20 s, −0.35%, inside the estimate's error), so ``plan`` does not try it.

Memory: none. Transformer Engine keeps each delayed linear's input and output gradient until
``backward_dw``, which the schedule runs inside the same layer step (:265, :289; the chunk's
last layer after its send, :597-601), so at most one layer's expert output gradients,
2·T·k·(h + 2·d_e) bytes for T tokens, top-k k, hidden h, expert width d_e, outlive the dgrad, for
one layer, beside the dispatch transient. The guide reports the increase as slight and did not
measure it; lcmoe adds no term until a measurement does.
"""

from __future__ import annotations

from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig


def _needs_ep_overlap(r: RunConfig) -> str | None:
    o = r.options
    if o.delay_wgrad_compute and not o.overlap_moe_expert_parallel_comm:
        return "delay_wgrad_compute needs overlap_moe_expert_parallel_comm"
    return None


def wgrad_in_graph(r: RunConfig) -> bool:
    """Whether a CUDA graph captures a delayed wgrad: the ``attn`` scope, or ``moe_router`` on a
    model with shared experts that are not overlapped (bridge comm_overlap.py:537-543; lcmoe turns
    ``moe_shared_expert_overlap`` off whenever EP overlap is on)."""
    scopes = r.options.cuda_graph_scope
    return "attn" in scopes or ("moe_router" in scopes and bool(r.model.shared_ffn))


def _graph_bias(r: RunConfig) -> str | None:
    o, m = r.options, r.model
    if o.delay_wgrad_compute and "attn" in o.cuda_graph_scope and (m.add_bias_linear or m.add_qkv_bias):
        return "delay_wgrad_compute with the attn CUDA-graph scope on a model with attention bias"
    return None


WGRAD_EP_OVERLAP = LegalityRule(
    "L-WGRAD-EP-OVERLAP",
    "mcore transformer_config.py:2748-2752; bridge comm_overlap.py:532-535",
    "turn EP overlap on (--ep-overlap) or drop --delay-wgrad-compute",
    _needs_ep_overlap,
)
WGRAD_GRAPH_BIAS = LegalityRule(
    "L-WGRAD-GRAPH-BIAS",
    "bridge comm_overlap.py:553-557; megatron-lm arguments.py:1843-1846",
    "drop the attn CUDA-graph scope or --delay-wgrad-compute",
    _graph_bias,
)
DELAY_WGRAD_RULES = (WGRAD_EP_OVERLAP, WGRAD_GRAPH_BIAS)
