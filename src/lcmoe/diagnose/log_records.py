"""What the log parser (``diagnose/logs.py``) finds in a training log, as frozen records: iteration
lines, memory reports, CUDA OOMs, communication-library failures, Megatron's theoretical memory,
and ``LogSummary``, everything of one log with counts of what was read, skipped and kept.

Sizes are in bytes and times in milliseconds as the log prints them (``elapsed_ms``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lcmoe.diagnose.failures import Finding


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration line: ``elapsed_ms`` is the average over the logging interval."""

    iteration: int
    train_iters: int
    elapsed_ms: float
    tflops_per_gpu: float | None
    global_batch_size: int | None
    lm_loss: float | None
    nan_iterations: int | None
    skipped_iterations: int | None


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """A per-rank memory report, in bytes. ``max_allocated`` is PyTorch's peak allocated (what the
    estimator's ``peak_allocated_bytes`` predicts); ``max_reserved`` its peak reserved."""

    rank: int
    iteration: int
    source: str  # "bridge" (decimal GB) or "megatron-lm" (MiB)
    allocated: float | None
    max_allocated: float | None
    reserved: float | None
    max_reserved: float | None
    alloc_retries: int | None = None


@dataclass(frozen=True, slots=True)
class OomEvent:
    line_number: int
    rank: int | None
    gpu_index: int
    tried_bytes: float
    capacity_bytes: float
    free_bytes: float
    process_in_use_bytes: float | None
    allocated_by_pytorch_bytes: float | None
    reserved_unallocated_bytes: float | None


@dataclass(frozen=True, slots=True)
class CommFailure:
    line_number: int
    rank: int | None
    library: str  # nccl | deepep | hybridep
    text: str


@dataclass(frozen=True, slots=True)
class TheoreticalMemory:
    weight_and_optimizer_bytes: float
    activation_bytes: float | None
    total_bytes: float | None


@dataclass(frozen=True, slots=True)
class LogSummary:
    """Everything found in one log; counts say how much was read, skipped and kept."""

    lines: int
    bytes_read: int
    overlong_lines: int
    garbage_lines: int
    iterations: tuple[IterationRecord, ...]
    iteration_lines: int
    step_summaries: tuple[tuple[float, float], ...]
    memory_reports: tuple[MemoryReport, ...]
    theoretical_memory: TheoreticalMemory | None
    timers: dict[str, tuple[float, float]]
    arguments: dict[str, str]
    ooms: tuple[OomEvent, ...]
    comm_failures: tuple[CommFailure, ...]
    config_summary_seen: bool
    failures: tuple[Finding, ...] = ()
    """Known failures (diagnose/failure_patterns.py) before the run's settings resolve them: first line and
    count per pattern. ``failures.resolve`` picks the ones that apply."""
    bridge_model_values: dict[str, str] = field(default_factory=dict)
    """The model fields Bridge's start-up "Configuration Summary" lists as non-default
    (``ConfigContainer.log_non_default_values``, Bridge training/config.py:1809): ``name -> repr``."""

    @property
    def found(self) -> list[str]:
        kinds = {
            "iteration lines": bool(self.iterations),
            "Step Time lines": bool(self.step_summaries),
            "memory reports": bool(self.memory_reports),
            "theoretical memory": self.theoretical_memory is not None,
            "timers": bool(self.timers),
            "argument dump": bool(self.arguments),
            "CUDA OOM": bool(self.ooms),
            "communication failures": bool(self.comm_failures),
            "known failures": bool(self.failures),
        }
        return [name for name, present in kinds.items() if present]

    @property
    def missing(self) -> list[str]:
        wanted = ["iteration lines", "memory reports", "argument dump"]
        return [name for name in wanted if name not in self.found]

    def peak_memory(self) -> MemoryReport | None:
        """The report with the highest ``max_allocated`` (the most loaded rank)."""
        reports = [r for r in self.memory_reports if r.max_allocated is not None]
        return max(reports, key=lambda r: r.max_allocated or 0.0) if reports else None

    def as_dict(self) -> dict[str, object]:
        peak = self.peak_memory()
        return {
            "lines": self.lines,
            "bytes_read": self.bytes_read,
            "overlong_lines": self.overlong_lines,
            "garbage_lines": self.garbage_lines,
            "iteration_lines": self.iteration_lines,
            "iterations_kept": len(self.iterations),
            "found": self.found,
            "missing": self.missing,
            "memory_reports": len(self.memory_reports),
            "peak_max_allocated_bytes": peak.max_allocated if peak else None,
            "peak_max_reserved_bytes": peak.max_reserved if peak else None,
            "theoretical_memory": (
                {
                    "weight_and_optimizer_bytes": self.theoretical_memory.weight_and_optimizer_bytes,
                    "activation_bytes": self.theoretical_memory.activation_bytes,
                    "total_bytes": self.theoretical_memory.total_bytes,
                }
                if self.theoretical_memory
                else None
            ),
            "timers_ms": {k: {"min": v[0], "max": v[1]} for k, v in self.timers.items()},
            "argument_count": len(self.arguments),
            "ooms": [
                {
                    "line": o.line_number,
                    "rank": o.rank,
                    "gpu": o.gpu_index,
                    "tried_bytes": o.tried_bytes,
                    "capacity_bytes": o.capacity_bytes,
                    "free_bytes": o.free_bytes,
                    "reserved_unallocated_bytes": o.reserved_unallocated_bytes,
                }
                for o in self.ooms
            ],
            "comm_failures": [
                {"line": c.line_number, "rank": c.rank, "library": c.library, "text": c.text}
                for c in self.comm_failures
            ],
        }
