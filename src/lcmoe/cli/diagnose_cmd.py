"""`lcmoe diagnose`: what a run's log says (`lcmoe preflight` and `lcmoe calibrate`, which share its
options and its reading of a log's run, are in preflight_cmd.py and calibrate_cmd.py).

Exit codes: diagnose 0 nothing wrong, 1 findings (OOM, slower than predicted, communication
failure, a known failure from diagnose/failure_patterns.py, regression),
2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, JSON, print_json, resolve_hardware, stdout
from lcmoe.diagnose.log_records import LogSummary
from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig

if TYPE_CHECKING:
    from lcmoe.estimate.time import TimeCoefficients

GIB = 1024.0**3
MIN_INTERVALS_FOR_SPEED = 3  # fewer steady intervals are noise, not a speed
PLAN = typer.Option(None, "--plan", help="plan.json (or its --emit directory) the run used")
CONFIG = typer.Option(None, "--config", help="the run's config: Megatron-LM args, Bridge overrides or YAML")
MODEL = typer.Option(None, "--model", "-m", help="catalog model (needed with a Bridge --config)")
GPU = typer.Option(None, "--gpu", "-g", help="catalog GPU (default: the plan's, else h100)")
GPUS = typer.Option(
    None, "--gpus", "-n", help="total GPUs (default: the plan's or the log's world size)", callback=ro.check_gpus
)
SEQ = typer.Option(None, "--seq-len", "-s", help="if the config does not set it")

_COMM_FIXES = {
    "deepep": "DeepEP failed: check NVSHMEM / IBGDA in the container and the buffer sizes; "
    "fall back to --dispatchers alltoall to confirm (LC-DISPATCHER)",
    "hybridep": "HybridEP failed: check NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN and the NVLink domain; "
    "fall back to alltoall to confirm (LC-DISPATCHER)",
    "nccl": "NCCL failed: rerun with NCCL_DEBUG=INFO; check the fabric, NCCL_IB_* settings and timeouts",
}


def resolve_log_run(
    summary: LogSummary,
    *,
    plan: Path | None,
    config: Path | None,
    model: str | None,
    gpu: str | None,
    gpus: int | None,
    seq_len: str | None,
) -> tuple[RunConfig | None, str]:
    """The run behind a log: --plan, else --config, else the log's own argument dump."""
    from lcmoe.config_io.plan_json import read_plan, run_from_plan

    if plan is not None:
        doc = read_plan(plan)
        hardware = resolve_hardware(gpu) if gpu else None
        return run_from_plan(doc, hardware=hardware), f"plan {plan}"
    hardware = resolve_hardware(gpu or "h100")
    assumed = "" if gpu else " (GPU assumed h100; pass --gpu)"
    if config is not None:
        from lcmoe.cli.check_cmd import parse_run, read_input

        if gpus is None:
            raise LcmoeError("--gpus", None, "is needed with --config", "e.g. --gpus 256")
        _, run, _unknown = parse_run(  # unknown keys are check's to report
            read_input(str(config)), model=model, gpu=hardware.name, gpus=gpus, seq_len=seq_len, hardware=hardware
        )
        return run, f"config {config}{assumed}"
    if summary.arguments:
        from lcmoe.cli.common import resolve_model
        from lcmoe.config_io.megatron_args import parse_megatron_dump

        spec = resolve_model(model) if model is not None else None
        parsed = parse_megatron_dump(summary.arguments, world_size=gpus, model=spec)
        return RunConfig(parsed.model, hardware, parsed.layout, parsed.options), f"the log's argument dump{assumed}"
    return None, "none: pass --plan, or --config with --gpus (Bridge logs carry no argument dump)"


def diagnose(
    log: str = typer.Argument(..., help="training log (plain or .gz), or - for standard input"),
    baseline: str = typer.Option(None, "--baseline", help="the earlier run's log: report a regression"),
    plan: Path = PLAN,
    config: Path = CONFIG,
    model: str = MODEL,
    gpu: str = GPU,
    gpus: int = GPUS,
    seq_len: str = SEQ,
    margin: float = typer.Option(0.05, "--margin", help="memory safety margin for the remedies"),
    calibration: Path = ro.CALIBRATION,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="one verdict line"),
) -> None:
    """Read a training log: OOM cause and remediation ladder, measured vs predicted speed, or a regression."""
    from lcmoe.cli.log_progress import read_log_with_progress

    if not 0.0 <= margin < 0.9:  # also refuses NaN
        raise LcmoeError("--margin", margin, "must be a fraction in [0, 0.9)", "e.g. 0.05")
    summary = read_log_with_progress(log, enabled=not json_output)
    if baseline is not None:
        _regression(read_log_with_progress(baseline, enabled=not json_output), summary, json_output, quiet)
        return
    result: dict[str, Any] = {"log": summary.as_dict()}
    run, source = resolve_log_run(summary, plan=plan, config=config, model=model, gpu=gpu, gpus=gpus, seq_len=seq_len)
    result["config_source"] = source
    coefficients = ro.time_coefficients(calibration, run.hardware) if run else None
    result["comm_failures"] = [
        {"library": c.library, "line": c.line_number, "text": c.text, "fix": _COMM_FIXES[c.library]}
        for c in summary.comm_failures
    ]
    known = _known_failures(summary, run)
    if known:
        result["failures"] = known
    if run is not None:
        memory = _memory_comparison(run, summary)
        if memory:
            result["memory"] = memory
    if summary.ooms:
        result["oom"] = _oom_diagnosis(run, summary, margin=margin, coefficients=coefficients)
    slower = _add_step_speed(result, run, summary, margin=margin, coefficients=coefficients)
    findings = bool(summary.comm_failures) or bool(known) or bool(summary.ooms) or slower
    code = EXIT_FINDINGS if findings else EXIT_OK
    result["exit_code"] = code
    if json_output:
        print_json(result)
    elif quiet:
        stdout.print(_verdict(result), highlight=False, soft_wrap=True)
    else:
        _render_diagnosis(result)
    raise typer.Exit(code)


def _memory_comparison(run: RunConfig, summary: LogSummary) -> dict[str, Any]:
    """The log's peak memory (its most loaded rank) against the prediction; empty without a
    memory report."""
    from lcmoe.estimate.memory import estimate_memory

    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    peak = summary.peak_memory()
    if peak is None or not peak.max_allocated:
        return {}
    out: dict[str, Any] = {
        "measured_max_allocated_bytes": peak.max_allocated,
        "measured_rank": peak.rank,
        "predicted_peak_allocated_bytes": memory.peak_allocated_bytes,
        "error": memory.peak_allocated_bytes / peak.max_allocated - 1,
    }
    if peak.max_reserved:
        # The log's max reserved is PyTorch's (no CUDA context or NCCL/DeepEP buffers).
        out.update(
            measured_max_reserved_bytes=peak.max_reserved,
            predicted_peak_torch_reserved_bytes=memory.peak_torch_reserved_bytes,
            reserved_error=memory.peak_torch_reserved_bytes / peak.max_reserved - 1,
        )
    return out


def _oom_diagnosis(
    run: RunConfig | None, summary: LogSummary, *, margin: float, coefficients: TimeCoefficients | None
) -> dict[str, Any]:
    """The OOM's cause and remediation ladder; with no run to re-estimate, the log's own evidence."""
    if run is None:
        from lcmoe.diagnose.oom import oom_sentences

        return {"evidence": oom_sentences(summary), "ladder": []}
    from lcmoe.diagnose.oom import diagnose_oom

    return diagnose_oom(run, summary, margin=margin, coefficients=coefficients).as_dict()


def _add_step_speed(
    result: dict[str, Any],
    run: RunConfig | None,
    summary: LogSummary,
    *,
    margin: float,
    coefficients: TimeCoefficients | None,
) -> bool:
    """Add the step statistics and, with a run and enough intervals, measured against predicted
    speed to ``result``; True when the run is slower than predicted (a finding)."""
    from lcmoe.diagnose.steps import step_stats

    stats = step_stats(summary)
    if stats is None:
        return False
    result["steps"] = stats.as_dict()
    if run is None or stats.intervals < MIN_INTERVALS_FOR_SPEED:
        return False
    from lcmoe.diagnose.performance import diagnose_speed

    speed = diagnose_speed(run, stats, summary, coefficients=coefficients, margin=margin)
    result["speed"] = speed.as_dict()
    return speed.verdict == "slower than predicted"


def _known_failures(summary: LogSummary, run: RunConfig | None) -> list[dict[str, object]]:
    """The log's known failures that apply to this run: settings from the log itself (Megatron-LM's
    argument dump, Bridge's Configuration Summary), else from the run diagnose was given."""
    from lcmoe.diagnose.failures import (
        resolve,
        settings_from_arguments,
        settings_from_bridge_summary,
        settings_from_run,
    )

    settings = settings_from_run(run) if run is not None else {}
    settings.update(settings_from_bridge_summary(summary.bridge_model_values, seen=summary.config_summary_seen))
    settings.update(settings_from_arguments(summary.arguments))
    return [finding.as_dict() for finding in resolve(summary.failures, settings)]


def _verdict(result: dict[str, Any]) -> str:
    parts = []
    oom = result.get("oom")
    if oom:
        best = oom.get("recommended")
        parts.append("OOM" + (f"; fix: {best['change']}" if best else ""))
    if "speed" in result:
        parts.append(result["speed"]["verdict"])
    if result.get("failures"):
        classes = dict.fromkeys(f"{f['class']} [{f['rule']}]" for f in result["failures"])
        parts.append("known failure: " + ", ".join(classes))
    if result["comm_failures"]:
        parts.append(f"{len(result['comm_failures'])} communication failures")
    return "; ".join(parts) or "nothing wrong found"


def _regression(a: LogSummary, b: LogSummary, json_output: bool, quiet: bool = False) -> None:
    from lcmoe.diagnose.regression import compare

    report = compare(a, b)
    result = report.as_dict()
    code = (
        EXIT_FINDINGS if report.step_verdict.startswith("regression") or report.memory_verdict == "more memory" else 0
    )
    result["exit_code"] = code
    if json_output:
        print_json(result)
        raise typer.Exit(code)
    if quiet:
        stdout.print(f"{report.step_verdict}; memory {report.memory_verdict}", highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    for label, stats in (("baseline", report.baseline), ("candidate", report.candidate)):
        if stats:
            stdout.print(
                f"{label}: median step {stats.median_seconds:.3f} s ± {stats.sigma_seconds:.3f} "
                f"over {stats.intervals} intervals ({stats.warmup_dropped} warm-up dropped)"
            )
    if report.step_change is not None and report.step_band is not None:
        stdout.print(
            f"step time {100 * report.step_change:+.1f}% (noise band ±{100 * report.step_band:.1f}%): "
            f"[bold]{report.step_verdict}[/]"
        )
    else:
        stdout.print(report.step_verdict)
    if report.memory_change is not None:
        stdout.print(f"peak allocated {100 * report.memory_change:+.1f}%: {report.memory_verdict}")
    else:
        stdout.print(report.memory_verdict)
    for key, (old, new) in report.config_diff.items():
        stdout.print(escape(f"  {key}: {old} → {new}"), highlight=False)
    for cause in report.causes:
        args = ", ".join(cause["arguments"]) if cause["arguments"] else ""  # type: ignore[arg-type]
        stdout.print(f"likely cause [{cause['rule']}] {cause['effect']} {escape(args)}", highlight=False)
    raise typer.Exit(code)


def _render_diagnosis(result: dict[str, Any]) -> None:
    log = result["log"]
    stdout.print(
        f"read {log['lines']} lines ({log['bytes_read'] / 1e6:.1f} MB): found {', '.join(log['found']) or 'nothing'}"
        + (f"; missing {', '.join(log['missing'])}" if log["missing"] else "")
        + (f"; {log['garbage_lines']} unreadable record lines skipped" if log["garbage_lines"] else ""),
        highlight=False,
    )
    stdout.print(f"config: {escape(str(result['config_source']))}", highlight=False)
    if "memory" in result:
        m = result["memory"]
        stdout.print(
            f"memory: measured max allocated {m['measured_max_allocated_bytes'] / GIB:.1f} GiB (rank "
            f"{m['measured_rank']}), predicted {m['predicted_peak_allocated_bytes'] / GIB:.1f} GiB "
            f"({100 * m['error']:+.1f}%)"
        )
    oom = result.get("oom")
    if oom:
        from lcmoe.cli.diagnose_view import render_oom

        render_oom(oom)
    if "steps" in result:
        s = result["steps"]
        stdout.print(
            f"steps: median {s['median_step_seconds']:.3f} s ± {s['sigma_step_seconds']:.3f} over "
            f"{s['intervals']} intervals ({s['source']}, {s['warmup_dropped']} warm-up dropped)"
        )
    speed = result.get("speed")
    if speed:
        _render_speed(speed)
    for known in result.get("failures", []):
        _render_known_failure(known)
    for failure in result["comm_failures"][:5]:
        text = escape(str(failure["text"]))
        stdout.print(f"[red]{failure['library']}[/] line {failure['line']}: {text}", highlight=False)
        stdout.print(f"  fix: {failure['fix']}", highlight=False)
    if not oom and "speed" not in result and result["config_source"].startswith("none"):
        stdout.print(f"no prediction: config {escape(str(result['config_source']))}")


def _render_speed(speed: dict[str, Any]) -> None:
    stdout.print(
        f"speed: measured {speed['measured_step_seconds']:.3f} s vs predicted "
        f"{speed['predicted_step_seconds']:.3f} s "
        f"(×{speed['measured_over_predicted']:.2f}, band ±{100 * speed['band']:.0f}%): [bold]{speed['verdict']}[/]"
    )
    top = sorted(speed["breakdown_seconds"].items(), key=lambda kv: -kv[1])[:6]
    stdout.print("  predicted step: " + ", ".join(f"{k} {v:.3f}s" for k, v in top), highlight=False)
    stdout.print(f"  bottleneck (largest non-compute term): {speed['bottleneck']}")
    for note in speed["notes"]:
        stdout.print(f"  note: {note}", highlight=False)
    for knob in speed["knobs"][:5]:
        fits = "fits" if knob["fits"] else "does not fit"
        stdout.print(
            f"  try [{knob['rule']}] {knob['change']}: {100 * knob['throughput_change']:+.1f}% tokens/s ({fits})",
            highlight=False,
        )


def _render_known_failure(known: dict[str, Any]) -> None:
    times = f", {known['count']} times" if known["count"] > 1 else ""
    rank = f" rank {known['rank']}" if known["rank"] is not None else ""
    maybe = (
        ""
        if known["confirmed"]
        else f" (unconfirmed: the log does not say whether {', '.join(known['requires'])}; pass --config or --plan)"
    )
    where = f"line {known['line']}{rank}{times}"
    text = escape(f"[{known['rule']}] {known['pattern']}{maybe} — {where}: {known['text']}")
    stdout.print(f"[red]{known['class']}[/] {text}", highlight=False)
    stdout.print(f"  why: {known['explanation']}", highlight=False)
    stdout.print(f"  fix: {known['fix']}", highlight=False)
    stdout.print(f"  source: {', '.join(known['sources'])}", highlight=False)


__all__ = ["EXIT_BAD_INPUT", "diagnose"]
