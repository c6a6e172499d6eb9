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
