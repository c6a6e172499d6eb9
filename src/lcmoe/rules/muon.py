"""Muon optimizer rules: what Megatron-Core, Megatron-LM and Bridge refuse beside ``optimizer=muon``.

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2 ``optimizer/__init__.py``,
``optimizer/optimizer_config.py`` and ``optimizer/layer_wise_optimizer.py`` (``mcore``),
``training/arguments.py`` (``megatron-lm``). What lcmoe's options cannot break, and so is kept out
of the table:

* ``overlap_param_gather_with_optimizer_step`` with the layer-wise optimizer (mcore
  __init__.py:761-766): never emitted; lcmoe emits ``overlap_param_gather`` off with Muon, as
  Bridge's Kimi-K2 recipe requires (``recipes/kimi/h100/kimi_k2.py:66-75``: "Muon requires
  distributed_optimizer=False and overlap_param_gather=False", kimi_k25_vl.py:172-175);
* the checkpoint format (megatron-lm :1686: torch or torch_dist only): lcmoe emits torch_dist;
* Torch FSDP2 (megatron-lm :1684): lcmoe has no FSDP2 option;
* the ``emerging_optimizers`` package (mcore __init__.py:756-760): a property of the container
  (NeMo containers that ship Bridge 0.6.2 install it; preflight does not check it).
"""

from __future__ import annotations

from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig


def _fsdp(r: RunConfig) -> str | None:
    if r.options.optimizer == "muon" and r.options.megatron_fsdp:
        return "the Muon optimizer does not run under Megatron-FSDP"
    return None


def _precision_aware(r: RunConfig) -> str | None:
    if r.options.optimizer == "muon" and r.options.precision_aware_optimizer:
        return (
            "the precision-aware optimizer (BF16/FP8 moments, BF16 main grads in place) is Adam only; "
            f"Muon keeps FP32 momentum (exp_avg_dtype={r.options.exp_avg_dtype})"
        )
    return None


def _offload(r: RunConfig) -> str | None:
    fraction = r.options.optimizer_offload_fraction
    if r.options.optimizer == "muon" and fraction > 0:
        return f"optimizer CPU offload ({fraction:g}) needs the precision-aware optimizer, which Muon cannot use"
    return None


def _fp16(r: RunConfig) -> str | None:
    if r.options.optimizer == "muon" and r.options.precision == "fp16":
        return "Muon (an emerging optimizer) refuses FP16 training"
    return None


def _instances(r: RunConfig) -> str | None:
    o = r.options
    if o.optimizer == "muon" and o.distributed_optimizer and o.num_distributed_optimizer_instances > 1:
        return (
            f"the layer-wise distributed optimizer has no optimizer instances "
            f"(num_distributed_optimizer_instances={o.num_distributed_optimizer_instances})"
        )
    return None


MUON_FSDP = LegalityRule(
    "L-MUON-FSDP",
    "megatron-lm arguments.py:1684-1685 ('Emerging optimizer does not support Megatron-FSDP')",
    "drop Megatron-FSDP (use the layer-wise distributed optimizer) or use Adam",
    _fsdp,
)
MUON_PRECISION_AWARE = LegalityRule(
    "L-MUON-PRECISION-AWARE",
    "mcore optimizer_config.py:430-436 ('--use-precision-aware-optimizer only supported with adam')",
    "drop --precision-aware-optimizer (FP32 momentum and main grads) or use Adam",
    _precision_aware,
)
MUON_OFFLOAD = LegalityRule(
    "L-MUON-OFFLOAD",
    "megatron-lm arguments.py:1803-1807; mcore optimizer/__init__.py:495-496, optimizer_config.py:430-433",
    "set the optimizer offload fraction to 0 or use Adam",
    _offload,
)
MUON_FP16 = LegalityRule(
    "L-MUON-FP16",
    "mcore optimizer/__init__.py:769-770 ('emerging optimizer with fp16 is not supported')",
    "train in BF16 (or an FP8 recipe) or use Adam",
    _fp16,
)
MUON_INSTANCES = LegalityRule(
    "L-MUON-INSTANCES",
    "mcore optimizer/layer_wise_optimizer.py:456-467, optimizer/__init__.py:832-840",
    "use one distributed-optimizer instance with Muon",
    _instances,
)
MUON_RULES = (MUON_FSDP, MUON_PRECISION_AWARE, MUON_OFFLOAD, MUON_FP16, MUON_INSTANCES)
