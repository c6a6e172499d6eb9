"""Training-log lines built from the documented formats (megatron-bridge-facts.md §7 and the
Megatron-LM sources it cites), for the diagnose / calibrate tests."""

from __future__ import annotations

import random
from collections.abc import Iterable


def argument_dump(dests: dict[str, object]) -> list[str]:
    """Megatron-LM ``_print_args``: sorted ``  name ..... value`` between the banners."""
    lines = ["------------------------ arguments ------------------------"]
    for name in sorted(dests):
        dots = "." * (48 - len(name))
        lines.append(f"  {name} {dots} {dests[name]}")
    lines.append("-------------------- end of arguments ---------------------")
    return lines


def iteration_line(
    iteration: int,
    total: int,
    elapsed_ms: float,
    *,
    gbs: int = 256,
    loss: float = 2.5,
    tflops: float | None = None,
    nan: int = 0,
) -> str:
    throughput = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" if tflops is not None else ""
    return (
        f" [2026-12-01 10:00:{iteration % 60:02d}] iteration {iteration:8d}/{total:8d} | consumed samples: "
        f"{iteration * gbs:12d} | elapsed time per iteration (ms): {elapsed_ms:.1f} |{throughput} learning rate: "
        f"1.000000E-04 | global batch size: {gbs:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 0.912 | "
        f"number of skipped iterations:   0 | number of nan iterations: {nan:3d} |"
    )


def step_time_line(seconds: float, tflops: float) -> str:
    return f"Step Time : {seconds:.2f}s GPU utilization: {tflops:.1f}MODEL_TFLOP/s/GPU"


def bridge_memory_line(rank: int, iteration: int, max_allocated_gb: float, max_reserved_gb: float) -> str:
    fields = {
        "mem-allocated-gigabytes": max_allocated_gb * 0.6,
        "mem-active-gigabytes": max_allocated_gb * 0.6,
        "mem-inactive-gigabytes": 0.5,
        "mem-reserved-gigabytes": max_reserved_gb,
        "mem-max-allocated-gigabytes": max_allocated_gb,
        "mem-max-active-gigabytes": max_allocated_gb,
        "mem-max-inactive-gigabytes": 1.2,
        "mem-max-reserved-gigabytes": max_reserved_gb,
        "mem-alloc-retires": 0,
        "mem-allocated-count": 12345,
    }
    body = " | ".join(f"{k}: {v:.5g}" for k, v in fields.items())
    return f"[Rank {rank}] (after {iteration} iterations) memory (GB) | {body}"


def megatron_memory_line(rank: int, iteration: int, max_allocated_mb: float, max_reserved_mb: float) -> str:
    return (
        f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {max_allocated_mb * 0.5} | "
        f"max allocated: {max_allocated_mb} | reserved: {max_reserved_mb} | max reserved: {max_reserved_mb}"
    )


def oom_line(tried_gib: float, gpu: int, capacity_gib: float, free_mib: float, unallocated_mib: float) -> str:
    in_use = capacity_gib - free_mib / 1024
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU {gpu} has a total "
        f"capacity of {capacity_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this "
        f"process has {in_use:.2f} GiB memory in use. Of the allocated memory {in_use - 1:.2f} GiB is allocated by "
        f"PyTorch, and {unallocated_mib:.2f} MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def timers_block(forward_backward: tuple[float, float]) -> list[str]:
    return [
        "(min, max) time across ranks (ms):",
        f"    forward-backward ...............................: ({forward_backward[0]:.2f}, {forward_backward[1]:.2f})",
        "    optimizer ......................................: (12.00, 13.50)",
    ]


def steady_iterations(count: int, step_ms: float, *, jitter: float = 0.01, seed: int = 0, **kw: object) -> list[str]:
    rng = random.Random(seed)
    lines = [iteration_line(1, count, step_ms * 3, **kw)]  # type: ignore[arg-type]
    for i in range(2, count + 1):
        lines.append(iteration_line(i, count, step_ms * (1 + rng.uniform(-jitter, jitter)), **kw))  # type: ignore[arg-type]
    return lines


def with_rank_prefix(lines: Iterable[str], rank: int) -> list[str]:
    return [f"[rank{rank}]: {line}" for line in lines]


# ----- failures users reported (issue #35 item 7; diagnose/failure_patterns.py) ---------------------------
# Each fixture is the report's own log text (the issue or pull request named in its docstring), put
# behind the launcher prefixes lcmoe reads. Where a report shows only part of a line, the rest is
# the format of the library that prints it (named there).


def watchdog_timeout_line(rank: int, seq: int, op_type: str) -> str:
    """PyTorch ProcessGroupNCCL's watchdog line, as quoted in NVIDIA/nccl#1610."""
    return (
        f"[rank{rank}]:[E218 04:54:22.864467604 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op_type}, NumelIn=1379328, NumelOut=1572864, "
        "Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
    )


def bridge_config_summary(model: dict[str, tuple[str, str]]) -> list[str]:
    """Bridge's start-up summary of non-default values (``ConfigContainer.log_non_default_values``,
    Bridge training/config.py:1809): ``model`` maps a field to (current repr, Megatron-Core default repr)."""
    lines = ["", "=" * 70, "Configuration Summary (Non-Default Values vs Megatron Core)", "=" * 70]
    lines += ["", "[model] Non-default values (vs Mcore TransformerConfig):"]
    lines += [f"  {name}: {current}  (Mcore default: {default})" for name, (current, default) in sorted(model.items())]
    lines += ["", "-" * 70, "Other Configuration Values:", "-" * 70, "", "[train]:", "  global_batch_size: 8192"]
    return [*lines, "", "=" * 70]


def deepep_dispatch_cpu_timeout() -> list[str]:
    """NVIDIA-NeMo/Megatron-Bridge#1335 (DeepSeek-V3, 1024 × H100) for the traceback and
    NVIDIA-NeMo/Megatron-Bridge#5067 (Kimi-K2, 256 × B200/B300) for DeepEP's counters."""
    return [
        "Global rank: 6, num_recv_tokens: -1, num_rdma_recv_tokens: -1",
        *(f"moe_recv_expert_counter[{i}]: -1" for i in range(4)),
        '[rank428]:   File "/opt/venv/lib/python3.12/site-packages/deep_ep/buffer.py", line 376, in dispatch',
        "[rank428]:     return self.internode_dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, "
        "is_token_in_rank, num_tokens_per_expert,",
        '[rank428]:   File "/opt/venv/lib/python3.12/site-packages/deep_ep/buffer.py", line 581, in internode_dispatch',
        "[rank428]:     recv_src_meta, send_rdma_head, send_nvl_head, event = self.runtime.internode_dispatch(",
        "[rank428]: RuntimeError: DeepEP error: timeout (dispatch CPU)",
        "[rank429]: RuntimeError: DeepEP error: timeout (dispatch CPU)",
    ]


def deepep_internode_kernel_timeout() -> list[str]:
    """deepseek-ai/DeepEP#137 (two H20 nodes on RoCE) and #158: the kernels' printf lines."""
    return [
        "DeepEP dispatch NVL receiver timeout, channel: 3, RDMA: 1, nvl: 6, src RDMA: 0, src nvl: 3, start: 0, end: 0",
        "DeepEP dispatch NVL receiver timeout, channel: 4, RDMA: 1, nvl: 4, src RDMA: 0, src nvl: 6, start: 0, end: 0",
        "DeepEP dispatch forwarder timeout (RDMA meta), channel: 4, RDMA: 1, nvl: 4, src RDMA lane: 0, dst NVL: 5, "
        "meta: 0, 0, 0, 0",
        "DeepEP dispatch forwarder timeout (RDMA meta), channel: 8, RDMA: 1, nvl: 7, src RDMA lane: 0, dst NVL: 2, "
        "meta: 0, 0, 0, 0",
    ]


def deepep_replaced_on_gb200() -> list[str]:
    """NVIDIA-NeMo/Megatron-Bridge#5992: the rank-0 warning Bridge prints on GB200 (message from
    flex_dispatcher_backend.py:65-66, in Python logging's default format) before training goes on."""
    return [
        "WARNING:megatron.bridge.training.flex_dispatcher_backend:DeepEP is only applicable to Ampere, Hopper, and "
        "Blackwell (B200/B300) GPUs. Current GPU: NVIDIA GB200. Falling back to alltoall.",
    ]


def hybridep_not_installed() -> list[str]:
    """NVIDIA-NeMo/Megatron-Bridge#3867: HybridEP selected, the package missing from the container;
    the message is Megatron-Core's (token_dispatcher.py:1057)."""
    return [
        '[rank0]:   File "/opt/megatron-lm/megatron/core/transformer/moe/token_dispatcher.py", line 1056, in __init__',
        "[rank0]:     raise ImportError(",
        "[rank0]: ImportError: HybridEP is not installed. Please install HybridEP package from "
        "https://github.com/deepseek-ai/DeepEP/tree/hybrid-ep.",
    ]


def cuda_graph_attn_nan() -> list[str]:
    """NVIDIA/Megatron-LM#5966 (Qwen3-235B, --cuda-graph-scope attn): the rerun state machine's
    error after the grad norm blew up."""
    return [
        "ERROR:megatron.core.rerun_state_machine: found NaN in local grad norm for bucket #0 in backward pass "
        "before data-parallel communication collective",
    ]


def cuda_graph_moe_hang() -> list[str]:
    """NVIDIA-NeMo/Megatron-Bridge#3517 (Qwen3-235B, 256 × GB200, TE-scoped graphs attn,moe_router,
    moe_preprocess): no iteration completes after capture; the NCCL watchdog then fires on the EP
    all-to-all."""
    return [
        "Start CUDA Graphs capture...",
        watchdog_timeout_line(0, 216, "ALLTOALL_BASE"),
        watchdog_timeout_line(1, 216, "ALLTOALL_BASE"),
    ]


def cuda_graph_capture_dynamic() -> list[str]:
    """NVIDIA/Megatron-LM#1598: the MoE token dispatcher's ``tensor.cpu()`` inside a captured scope;
    the error text is PyTorch's (pytorch/pytorch#87794)."""
    return [
        '[rank0]:   File "/opt/megatron-lm/megatron/core/transformer/moe/token_dispatcher.py", in preprocess',
        "[rank0]: RuntimeError: CUDA error: operation not permitted when stream is capturing",
    ]


def a2a_overlap_deadlock() -> list[str]:
    """NVIDIA/Megatron-LM#1810: with --overlap-moe-expert-parallel-comm, ranks enqueue the EP
    all-to-alls in different orders and hang early in training; the watchdog then fires."""
    return [
        watchdog_timeout_line(13, 216, "ALLTOALL_BASE"),
        "[rank13]:[E218 04:54:22.864535778 ProcessGroupNCCL.cpp:1795] [PG ID 11 PG GUID 119 Rank 1] Exception "
        "(either an error or timeout) detected by watchdog at work: 216, last enqueued NCCL work: 220, last "
        "completed NCCL work: 215.",
    ]


def cp_divisibility_failures() -> dict[str, list[str]]:
    """One failing log per CP / THD / SP divisibility error, keyed by pattern id: Bridge's start-up
    assertion (config.py:1576), NVIDIA-NeMo/RL#2110 (TP and PP with packing: the SP scatter),
    Transformer Engine's CP attention (context_parallel.py:1571), NVIDIA-NeMo/Megatron-Bridge#1964
    (CP 32 with packed sequences: get_batch_on_this_cp_rank views cu_seqlens as [64, 0])."""
    return {
        "cp-seq-not-divisible": [
            "[rank0]: AssertionError: Sequence length must be divisible by 2 * context parallel size if context "
            "parallel is used.",
        ],
        "sp-first-dim-not-divisible": [
            '  File "megatron/core/tensor_parallel/mappings.py", line 518, in '
            "reduce_scatter_to_sequence_parallel_region",
            '  File "megatron/core/tensor_parallel/mappings.py", line 365, in forward',
            "    return _reduce_scatter_along_first_dim(",
            "AssertionError: First dimension of the tensor should be divisible by tensor parallel size",
        ],
        "te-cp-seq-per-gpu-odd": [
            "[rank3]: AssertionError: Sequence length per GPU needs to be divisible by 2!",
        ],
        "thd-cp-reshape": [
            '[rank5]:   File "/opt/megatron-lm/megatron/core/utils.py", line 1861, in get_batch_on_this_cp_rank',
            "[rank5]:     val = val.view(",
            "[rank5]: RuntimeError: shape '[1, 64, 0]' is invalid for input of size 5",
        ],
    }


_GRAPH_MODULES = """
  - _target_: megatron.core.transformer.enums.CudaGraphScope
    _call_: true
    _args_:
    - 1
    _name_: attn"""


def saved_bridge_config(
    *, dispatcher: str, backend: str | None, shared_expert_overlap: bool, graphs: bool = True
) -> str:
    """An excerpt of the resolved config Bridge saves at start-up (``logger.save_config_filepath``:
    ``cfg.to_yaml``, Bridge training/setup.py:800), with enums and dtypes as Megatron's YAML
    representers write them (megatron/training/config/yaml_utils.py) and Megatron-Core 0.19's
    ``cuda_graph_modules`` for ``cuda_graph_scope``."""
    return f"""model:
  _target_: megatron.bridge.models.qwen.qwen_provider.Qwen3MoEModelProvider
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  virtual_pipeline_model_parallel_size: null
  expert_model_parallel_size: 8
  expert_tensor_parallel_size: 1
  context_parallel_size: 2
  sequence_parallel: false
  seq_length: 16384
  moe_token_dispatcher_type: {dispatcher}
  moe_flex_dispatcher_backend: {backend or "null"}
  moe_shared_expert_overlap: {str(shared_expert_overlap).lower()}
  cuda_graph_impl: {"transformer_engine" if graphs else "none"}
  cuda_graph_modules:{_GRAPH_MODULES if graphs else " []"}
  params_dtype:
    _target_: torch.bfloat16
    _call_: false
train:
  micro_batch_size: 1
  global_batch_size: 64
optimizer:
  lr: 0.0003
comm_overlap:
  overlap_moe_expert_parallel_comm: false
logger:
  save_config_filepath: /results/config.yaml
"""
