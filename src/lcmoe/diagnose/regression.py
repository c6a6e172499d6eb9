"""Two runs compared: step-time and memory deltas with noise bands, the configuration diff, and
the likely causes mapped to LC-* rule ids.

A step-time change is called a regression (or an improvement) only when it exceeds both
``MIN_RELATIVE_CHANGE`` and 3 combined standard errors of the two medians
(√(seA² + seB²), se = √(π/2)·σ/√n from each run's steady intervals; steps.py), so a noisy run is
not called a regression. Peak memory is deterministic to within the allocator's rounding; a
change above ``MEMORY_TOLERANCE`` of the larger peak is reported."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lcmoe.diagnose.log_records import LogSummary
from lcmoe.diagnose.steps import StepStats, step_stats

MIN_RELATIVE_CHANGE = 0.01
MEMORY_TOLERANCE = 0.01
# Arguments that never change speed or memory (paths, names, logging, seeds, rank bookkeeping).
_IRRELEVANT = (
    "save",
    "load",
    "data_path",
    "data_cache_path",
    "tensorboard",
    "wandb",
    "log_",
    "vocab_file",
    "merge_file",
    "tokenizer_model",
    "seed",
    "rank",
    "local_rank",
    "exit_",
    "eval_",
    "save_interval",
    "timing_log",
    "one_logger",
    "logging_level",
    "ckpt",
    "pretrained_checkpoint",
    "train_data_path",
    "valid_data_path",
    "test_data_path",
    "split",
    "lr",
    "min_lr",
    "weight_decay",
    "adam_beta",
    "adam_eps",
    "clip_grad",
    "init_method",
    "rerun_mode",
    "profile",
    "straggler",
    "finetune",
    "non_persistent",
)
# Argument name prefixes → (likely effect, rule id).
_CAUSES: tuple[tuple[str, str, str], ...] = (
    ("recompute", "activation recompute changed (memory ↔ time)", "LC-RECOMPUTE-SELECTIVE"),
    ("context_parallel_size", "CP changed", "LC-CP-START"),
    ("cp_comm_type", "CP exchange changed", "LC-CP-COMM"),
    ("hierarchical_context_parallel", "CP exchange changed", "LC-CP-COMM"),
    ("tensor_model_parallel_size", "TP changed", "LC-TP-FOR-CP"),
    ("expert_model_parallel_size", "EP changed", "LC-CP-NOT-EP"),
    ("expert_tensor_parallel_size", "ETP changed", "LC-CP-NOT-EP"),
    ("moe_token_dispatcher_type", "token dispatcher changed", "LC-DISPATCHER"),
    ("moe_flex_dispatcher_backend", "token dispatcher changed", "LC-DISPATCHER"),
    ("moe_enable_deepep", "token dispatcher changed", "LC-DISPATCHER"),
    ("overlap_moe_expert_parallel_comm", "EP communication overlap changed", "LC-DISPATCHER"),
    ("cuda_graph", "CUDA graphs changed", "LC-CUDA-GRAPH-STATIC"),
    ("enable_cuda_graph", "CUDA graphs changed", "LC-CUDA-GRAPH-STATIC"),
    ("external_cuda_graph", "CUDA graphs changed", "LC-CUDA-GRAPH-STATIC"),
    ("optimizer_cpu_offload", "optimizer CPU offload changed", "LC-OFFLOAD-128K"),
    ("optimizer_offload_fraction", "optimizer CPU offload changed", "LC-OFFLOAD-128K"),
    ("fp8", "precision changed", "LC-PRECISION"),
    ("fp4", "precision changed", "LC-PRECISION"),
    ("bf16", "precision changed", "LC-PRECISION"),
    ("global_batch_size", "global batch changed (more microbatches amortise the bubble)", "LC-GBS-SHRINK"),
    ("micro_batch_size", "micro batch changed", "LC-GBS-SHRINK"),
    ("pipeline_model_parallel", "pipeline changed (bubble, DP)", "LC-DP-BUDGET"),
    ("virtual_pipeline_model_parallel_size", "interleaving changed (bubble)", "LC-DP-BUDGET"),
    ("num_layers_per_virtual_pipeline_stage", "interleaving changed (bubble)", "LC-DP-BUDGET"),
    ("world_size", "GPU count changed", "LC-DP-BUDGET"),
    ("seq_length", "sequence length changed", "LC-CP-START"),
    ("moe_router", "routing changed (expert load balance)", "LC-DISPATCHER"),
    ("moe_expert_capacity_factor", "token dropping changed (expert load)", "LC-DISPATCHER"),
    ("moe_aux_loss", "load-balancing loss changed (expert load)", "LC-DISPATCHER"),
)


@dataclass(frozen=True, slots=True)
class Regression:
    baseline: StepStats | None
    candidate: StepStats | None
    step_change: float | None
    step_band: float | None
    step_verdict: str
    memory_baseline_bytes: float | None
    memory_candidate_bytes: float | None
    memory_change: float | None
    memory_verdict: str
    config_diff: dict[str, tuple[str | None, str | None]]
    causes: list[dict[str, object]]

    def as_dict(self) -> dict[str, object]:
        return {
            "baseline": self.baseline.as_dict() if self.baseline else None,
            "candidate": self.candidate.as_dict() if self.candidate else None,
            "step_time_change": self.step_change,
            "step_time_band": self.step_band,
            "step_time_verdict": self.step_verdict,
            "peak_allocated_baseline_bytes": self.memory_baseline_bytes,
            "peak_allocated_candidate_bytes": self.memory_candidate_bytes,
            "peak_allocated_change": self.memory_change,
            "memory_verdict": self.memory_verdict,
            "config_diff": {k: {"baseline": a, "candidate": b} for k, (a, b) in self.config_diff.items()},
            "causes": self.causes,
        }


def _relevant(name: str) -> bool:
    return not any(name == prefix or name.startswith(prefix) for prefix in _IRRELEVANT)


def config_diff(a: dict[str, str], b: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Arguments whose values differ (absent on one side = None), irrelevant ones left out."""
    return {
        key: (a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key) and _relevant(key)
    }


def likely_causes(diff: dict[str, tuple[str | None, str | None]]) -> list[dict[str, object]]:
    """Changed arguments grouped by their likely effect, each with its LC-* rule id."""
    grouped: dict[str, tuple[str, list[str]]] = {}
    for key in diff:
        for prefix, effect, rule in _CAUSES:
            if key.startswith(prefix):
                grouped.setdefault(effect, (rule, []))[1].append(key)
                break
    return [{"effect": effect, "rule": rule, "arguments": keys} for effect, (rule, keys) in grouped.items()]


def compare(baseline: LogSummary, candidate: LogSummary) -> Regression:
    a, b = step_stats(baseline), step_stats(candidate)
    change = band = None
    verdict = "no steady-state iterations in one of the logs"
    if a and b:
        change = b.median_seconds / a.median_seconds - 1
        combined = math.hypot(a.median_error_seconds, b.median_error_seconds)
        band = max(MIN_RELATIVE_CHANGE, 3 * combined / a.median_seconds)
        if change > band:
            verdict = "regression (slower)"
        elif change < -band:
            verdict = "improvement (faster)"
        else:
            verdict = "within noise"
    peak_a, peak_b = baseline.peak_memory(), candidate.peak_memory()
    mem_a = peak_a.max_allocated if peak_a else None
    mem_b = peak_b.max_allocated if peak_b else None
    mem_change = None
    mem_verdict = "no memory reports in one of the logs"
    if mem_a and mem_b:
        mem_change = mem_b / mem_a - 1
        if abs(mem_b - mem_a) <= MEMORY_TOLERANCE * max(mem_a, mem_b):
            mem_verdict = "unchanged"
        else:
            mem_verdict = "more memory" if mem_b > mem_a else "less memory"
    diff = config_diff(baseline.arguments, candidate.arguments)
    causes = likely_causes(diff)
    if not causes and verdict.startswith("regression"):
        source = "the argument dumps" if baseline.arguments and candidate.arguments else "the logs (no argument dump)"
        causes.append(
            {
                "effect": f"no configuration change in {source}: container, driver, nodes or network",
                "rule": "LC-BASELINE-DRIFT",
                "arguments": [],
            }
        )
    return Regression(a, b, change, band, verdict, mem_a, mem_b, mem_change, mem_verdict, diff, causes)
