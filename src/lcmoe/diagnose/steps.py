"""Steady-state step time from a log's iteration lines, with a noise estimate.

The first logged intervals include warm-up, CUDA-graph capture and allocator growth (facts §7b),
so they are dropped: two when at least six intervals were logged, one when at least three. A
restarted job (the iteration counter goes back) keeps only the last segment. The spread is the
median absolute deviation scaled to a normal σ (1.4826·MAD), robust to the odd slow interval
(checkpoint save, evaluation)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from lcmoe.diagnose.log_records import IterationRecord, LogSummary

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class StepStats:
    source: str  # "iteration lines" | "Step Time lines"
    intervals: int
    warmup_dropped: int
    median_seconds: float
    sigma_seconds: float
    tflops_per_gpu: float | None
    global_batch_size: int | None
    nan_iterations: int

    @property
    def median_error_seconds(self) -> float:
        """Standard error of the median: √(π/2)·σ/√n."""
        return math.sqrt(math.pi / 2) * self.sigma_seconds / math.sqrt(max(self.intervals, 1))

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "intervals": self.intervals,
            "warmup_dropped": self.warmup_dropped,
            "median_step_seconds": self.median_seconds,
            "sigma_step_seconds": self.sigma_seconds,
            "median_error_seconds": self.median_error_seconds,
            "tflops_per_gpu": self.tflops_per_gpu,
            "global_batch_size": self.global_batch_size,
            "nan_iterations": self.nan_iterations,
        }


def _last_segment(records: tuple[IterationRecord, ...]) -> list[IterationRecord]:
    segment: list[IterationRecord] = []
    for record in records:
        if segment and record.iteration <= segment[-1].iteration:
            segment = []
        segment.append(record)
    return segment


def warmup_to_drop(count: int) -> int:
    return 2 if count >= 6 else (1 if count >= 3 else 0)


def _robust(values: list[float]) -> tuple[float, float]:
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, MAD_TO_SIGMA * mad


def step_stats(summary: LogSummary) -> StepStats | None:
    """Median step time of the steady-state intervals, or None when the log has none."""
    records = _last_segment(summary.iterations)
    if records:
        drop = warmup_to_drop(len(records))
        steady = records[drop:]
        median, sigma = _robust([r.elapsed_ms / 1000.0 for r in steady])
        tflops = [r.tflops_per_gpu for r in steady if r.tflops_per_gpu is not None]
        gbs = [r.global_batch_size for r in steady if r.global_batch_size is not None]
        nans = [r.nan_iterations for r in steady if r.nan_iterations is not None]
        return StepStats(
            source="iteration lines",
            intervals=len(steady),
            warmup_dropped=drop,
            median_seconds=median,
            sigma_seconds=sigma,
            tflops_per_gpu=statistics.median(tflops) if tflops else None,
            global_batch_size=gbs[-1] if gbs else None,
            nan_iterations=max(nans) if nans else 0,
        )
    if summary.step_summaries:
        drop = warmup_to_drop(len(summary.step_summaries))
        steady_steps = summary.step_summaries[drop:]
        median, sigma = _robust([s for s, _ in steady_steps])
        return StepStats(
            source="Step Time lines",
            intervals=len(steady_steps),
            warmup_dropped=drop,
            median_seconds=median,
            sigma_seconds=sigma,
            tflops_per_gpu=statistics.median(t for _, t in steady_steps),
            global_batch_size=None,
            nan_iterations=0,
        )
    return None
