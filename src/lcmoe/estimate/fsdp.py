"""Megatron-FSDP (``ddp.use_megatron_fsdp``) with expert parallelism, as Megatron-Core 0.19.2 runs
it: what each sharding strategy shards, the parameter and gradient buffers a layer holds while it
runs, and the data-parallel traffic beyond the distributed optimizer's.

Sources (megatron-core 0.19.2, ``core`` = ``megatron/core``):

* **Groups.** Dense parameters shard over DP·CP, routed experts over the expert-DP group
  (``distributed/fsdp/mcore_fsdp_adapter.py:340-460``: ``expt_dp_group`` beside the dense FSDP
  group, each with its own mesh), the same groups the distributed optimizer uses
  (``memory.optimizer_shards``).
* **Strategies** (``data_parallel_sharding_strategy``, DDPConfig default ``no_shard``): ``optim``
  shards the optimizer state; ``optim_grads`` also the gradients, reduce-scattered after every
  backward (``megatron_fsdp/megatron_fsdp.py:755-771, 862-882``: ``grad_reduce_every_bprop``);
  ``optim_grads_params`` also the parameters, with ``TransformerLayer`` / ``MoETransformerLayer``
  / ``MambaLayer`` as the units that are all-gathered before their forward (prefetching the next,
  :783-800), resharded after it, and all-gathered again before their backward (:905-912)
  (``mcore_fsdp_adapter.py:158-162``). Megatron-FSDP always runs the distributed optimizer
  (Bridge config.py:1073-1077; megatron-lm arguments.py:1106-1112).
* **Buffers.** Under ``optim_grads_params`` a rank holds the gathered parameters of the unit that
  runs and of the one prefetched, and the unsharded gradients of the unit being reduce-scattered
  and of the next one: 2 units' weights and 2 units' gradients, a unit being one decoder layer's
  parameters on the rank (over TP, and EP·ETP for experts).

Not modelled: HSDP / hybrid FSDP (``outer_dp_sharding_strategy``), FSDP double buffers and NCCL
user buffers (``fsdp_double_buffer``, ``nccl_ub``), the forward prefetch that activation
recompute cancels (:783-786).
"""

from __future__ import annotations

from lcmoe.workload import TrainingOptions

# Units a rank holds gathered at once under optim_grads_params: the running one and the prefetched one.
FSDP_UNITS_IN_FLIGHT = 2


def shards_params(options: TrainingOptions) -> bool:
    """Whether Megatron-FSDP shards the parameters themselves (ZeRO-3, ``optim_grads_params``)."""
    return options.megatron_fsdp and options.megatron_fsdp_sharding == "optim_grads_params"


def shards_grads(options: TrainingOptions) -> bool:
    """Whether Megatron-FSDP shards the gradients (``optim_grads`` or ``optim_grads_params``)."""
    return options.megatron_fsdp and options.megatron_fsdp_sharding in ("optim_grads", "optim_grads_params")


def unit_buffer_bytes(
    unit_params: float, weight_bytes: float, grad_bytes: float, options: TrainingOptions
) -> tuple[float, float]:
    """(weight, gradient) bytes of the unsharded units a rank holds under ``optim_grads_params``:
    FSDP_UNITS_IN_FLIGHT · P_unit · w and FSDP_UNITS_IN_FLIGHT · P_unit · g, P_unit = one decoder
    layer's parameters on the rank; (0, 0) under the other strategies (parameters stay whole)."""
    if not shards_params(options):
        return 0.0, 0.0
    return FSDP_UNITS_IN_FLIGHT * unit_params * weight_bytes, FSDP_UNITS_IN_FLIGHT * unit_params * grad_bytes


def fsdp_extra_dp_bytes(
    params: tuple[float, float],
    groups: tuple[int, int],
    *,
    num_microbatches: int,
    weight_bytes: float,
    grad_bytes: float,
    options: TrainingOptions,
) -> float:
    """Bytes each rank receives over DP per step beyond the distributed optimizer's
    (g + 2)·P·(N−1)/N (one gradient reduce-scatter and one BF16 parameter all-gather per step,
    what lcmoe's DP term counts), for the (dense, expert) parameters ``params`` over (DP·CP, EDP)
    ``groups``, M microbatches: ``optim_grads_params`` all-gathers every unit twice and
    reduce-scatters its gradients once per microbatch, M·(2·w + g) − (g + 2); ``optim_grads``
    reduce-scatters per microbatch and gathers the updated parameters once, (M − 1)·g; ``optim`` and
    ``no_shard`` as the distributed optimizer, 0."""
    if not options.megatron_fsdp:
        return 0.0
    m = num_microbatches
    if options.megatron_fsdp_sharding == "optim_grads_params":
        per_value = m * (2 * weight_bytes + grad_bytes) - (grad_bytes + 2)
    elif options.megatron_fsdp_sharding == "optim_grads":
        per_value = (m - 1) * grad_bytes
    else:
        return 0.0
    return per_value * sum(p * (n - 1) / n for p, n in zip(params, groups, strict=True))
