"""Megatron-FSDP rules: what Megatron-Core and Bridge refuse beside ``ddp.use_megatron_fsdp``.

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2
``distributed/fsdp/mcore_fsdp_adapter.py`` (``mcore``), ``training/arguments.py``
(``megatron-lm``), megatron-bridge 0.6.2 ``training/config.py`` (``bridge``). Muon under FSDP is
``L-MUON-FSDP`` (rules.muon). What lcmoe's emitters already satisfy, and so is kept out of the
table:

* the distributed optimizer, which both turn on (bridge :1073-1077, megatron-lm :1106-1112);
* ``ckpt_format=fsdp_dtensor`` (bridge :1097-1101, megatron-lm :1146-1147): not yet emitted (see the report);
* ``CUDA_DEVICE_MAX_CONNECTIONS`` other than 1 (bridge :1102-1104, megatron-lm :1143-1144): not yet
  emitted (the emitted environment still sets 1);
* ``reuse_grad_buf_for_mxfp8_param_ag`` off, ``average_in_collective`` off with symmetric
  registration (bridge :1086-1095): Bridge switches them itself;
* ``moe_single_grouped_weight`` (megatron-lm :1115-1125), ``fsdp_double_buffer`` with EP overlap
  (mcore :168-172), ``use_tp_pp_dp_mapping`` (bridge :1116): never emitted;
* TE ≥ 2.10 with ``gradient_accumulation_fusion`` (mcore :147-151): the container's TE.
"""

from __future__ import annotations

from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig

# CUDA-graph scopes that capture single layers (every scope but a whole-iteration graph).
_PER_LAYER = frozenset({"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"})


def _ep_overlap_graphs(r: RunConfig) -> str | None:
    o = r.options
    scopes = o.cuda_graph_scope & _PER_LAYER
    if o.megatron_fsdp and o.overlap_moe_expert_parallel_comm and scopes:
        return f"EP overlap under Megatron-FSDP runs without per-layer CUDA graphs (scope {','.join(sorted(scopes))})"
    return None


FSDP_EP_OVERLAP_GRAPHS = LegalityRule(
    "L-FSDP-EP-OVERLAP-GRAPHS",
    "mcore distributed/fsdp/mcore_fsdp_adapter.py:168-180",
    "drop the per-layer CUDA-graph scopes (or use full_iteration), or EP overlap, or Megatron-FSDP",
    _ep_overlap_graphs,
)
FSDP_RULES = (FSDP_EP_OVERLAP_GRAPHS,)
