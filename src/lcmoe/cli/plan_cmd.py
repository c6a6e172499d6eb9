"""`lcmoe plan`: search every legal layout and rank by predicted throughput (`report` and `sweep`
live in report_cmd / sweep_cmd and are re-exported here for the command table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from lcmoe.cli import request as rq
from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, JSON, abort, print_json, stdout
from lcmoe.cli.emit_options import DATA_PATHS, EMIT, FORCE, RUN_SCRIPT, check_emit_options, emit_plan
from lcmoe.cli.report_cmd import report, write_report
from lcmoe.cli.sweep_cmd import sweep
from lcmoe.errors import LcmoeError
from lcmoe.plan.format import (
    AT_RISK,
    at_risk_note,
    layout_text,
    model_notes,
    packing_text,
    peft_text,
    plans_title,
    ranking_notes,
    recompute_text,
    reference_text,
)
from lcmoe.plan.payload import plan_payload

__all__ = ["plan", "render_plans", "report", "sweep"]


def plan(
    ctx: typer.Context,
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    gbs: int = rq.GBS,
    precision: str = ro.PRECISION_LIST,
    dispatchers: str = ro.DISPATCHER_LIST,
    top: int = rq.TOP,
    margin: float = rq.MARGIN,
    megatron_core_version: str = rq.MCORE,
    no_offload: bool = typer.Option(False, "--no-offload", help="never offload the optimizer"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs", help="variable-length data: no CUDA graphs"),
    emit: Path = EMIT,
    force: bool = FORCE,
    data_paths: list[str] = DATA_PATHS,
    run_script: str = RUN_SCRIPT,
    report_dir: Path = typer.Option(None, "--report", help="write report.html / report.md (with plots) to DIR"),
    steps: int = typer.Option(100, "--steps", min=1, help="training steps for the GPU-hour estimate (--emit)"),
    yes: bool = typer.Option(False, "--yes", help="confirm writing a launcher for more than 64 GPUs"),
    container: str = typer.Option(None, "--container", help="launcher container image (e.g. your registry mirror)"),
    pip_index_url: str = typer.Option(None, "--pip-index-url", help="pip mirror the launcher exports"),
    mounts: list[str] = typer.Option([], "--mount", help="container mount SRC:DST (repeatable)"),
    job_name: str = typer.Option(None, "--job-name", help="Slurm job name"),
    account: str = typer.Option(None, "--account", help="Slurm account"),
    partition: str = typer.Option(None, "--partition", help="Slurm partition"),
    time_limit: str = typer.Option("04:00:00", "--time-limit", help="Slurm time limit"),
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    peft: str = ro.PEFT,
    lora_rank: int = ro.LORA_RANK,
    lora_targets: str = ro.LORA_TARGETS_OPTION,
    lora_input_regather: bool = ro.LORA_REGATHER,
    doc_lengths: str = ro.DOC_LENGTHS,
    optimizer: str = ro.OPTIMIZER,
    muon_ns_steps: int = ro.MUON_NS_STEPS,
    muon_tp_mode: str = ro.MUON_TP_MODE,
    rank: str = rq.RANK,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="best plan line only"),
) -> None:
    """Search every legal layout for MODEL on GPUS × GPU at SEQ_LEN; rank by predicted tokens/s/GPU."""
    launch = {k: ctx.params[k] for k in _LAUNCH_KEYS}
    if emit is not None:
        check_emit_options(emit, launch, force=force)
    request = rq.plan_request(rq.PlanOptions.from_params(ctx.params))
    result = rq.search_or_min_gpus(request, quiet or json_output)
    payload = plan_payload(request, result)
    if not result.plans:
        fewer = rq.fewer_gpus_that_fit(request)
        if fewer:
            payload["fewer_gpus_that_fit"] = fewer
    if emit is not None and result.plans:
        quiet_emit = quiet or json_output
        emit_plan(emit, payload, result, steps=steps, confirmed=yes, force=force, launch=launch, quiet=quiet_emit)
    report_error = _try_report(request, result, report_dir, calibration, show_progress=not (quiet or json_output))
    if json_output:
        print_json(payload)
    elif quiet:
        _print_quiet(payload)
    else:
        render_plans(payload)
    if report_error:
        abort(f"the plan is above, but {report_error}", EXIT_FINDINGS)
    if not result.plans:
        raise typer.Exit(EXIT_FINDINGS)


# The launcher settings `--emit` writes, by parameter name (emit_options.check_emit_options).
_LAUNCH_KEYS = (
    "job_name",
    "mounts",
    "account",
    "partition",
    "time_limit",
    "pip_index_url",
    "container",
    "run_script",
    "data_paths",
)


def _try_report(
    request: Any, result: Any, report_dir: Path | None, calibration: Path | None, *, show_progress: bool
) -> str:
    """Write ``--report DIR`` after the search; a failure (an unwritable DIR) comes back as one
    sentence, so the plan still prints and the command exits 1 instead of losing the search."""
    if report_dir is None:
        return ""
    try:
        out = Path(report_dir) / "report.html"
        write_report(request, result, out, rq.SWEEP_DEFAULT, calibration, show_progress=show_progress)
    except LcmoeError as exc:  # report/build.py names its own --out: say --report here
        field = "--report" if exc.field == "--out" else exc.field
        return f"the report was not written: {LcmoeError(field, exc.value, exc.rule, exc.fix)}"
    except OSError as exc:
        return f"the report was not written to {report_dir}: {exc.strerror or exc.__class__.__name__}"
    return ""


def _print_quiet(payload: dict[str, Any]) -> None:
    if payload["plans"]:
        best = payload["plans"][0]
        stdout.print(
            f"{layout_text(best['layout'])} {best['precision']} recompute={recompute_text(best)} "
            f"{best['dispatcher']} offload={best['optimizer_offload_fraction']:g} "
            + (f"lora=r{best['peft']['rank']} " if best.get("peft") else "")
            + f"tokens/s/GPU={best['time']['tokens_per_sec_per_gpu']:.0f}"
            + (f" band=±{best['time']['band_pct']:.0f}%" if best["time"].get("band_pct") is not None else "")
            + (f"{AT_RISK} may OOM" if best["memory"].get("oom_risk") else ""),
            soft_wrap=True,
        )
    else:
        need = payload.get("min_gpus_needed")
        stdout.print(
            f"no plan fits; at least {need} GPUs needed"
            if need
            else f"no plan fits on up to 16 × {payload['inputs']['num_gpus']} GPUs",
            soft_wrap=True,
        )


odd_factor = rq.odd_part


def closest_text(closest: dict[str, Any]) -> str:
    """The plan nearest to fitting when nothing fits: its layout and settings, and how far each
    pipeline stage is over (or under) the GPU."""
    memory = closest["memory"]
    gib = 1024**3
    over = (memory["peak_reserved_bytes"] - memory["capacity_bytes"]) / gib
    stages = [
        f"stage {s['stage']} {s['peak_reserved_bytes'] / gib:.1f} GiB ("
        + (f"{d:.1f} over" if (d := (s["peak_reserved_bytes"] - memory["capacity_bytes"]) / gib) > 0 else "fits")
        + ")"
        for s in memory["stages"]
    ]
    return (
        f"closest: {layout_text(closest['layout'])}, recompute {recompute_text(closest)}, {closest['precision']}, "
        f"optimizer offload {closest['optimizer_offload_fraction']:g}: peak {memory['peak_reserved_bytes'] / gib:.1f} "
        f"GiB of {memory['capacity_bytes'] / gib:.1f}, {over:.1f} GiB over"
        + (f"; by pipeline stage: {', '.join(stages)}" if len(stages) > 1 else "")
        + "; add GPUs, lower precision, or shorten the sequence"
    )


def render_plans(payload: dict[str, Any]) -> None:
    inputs = payload["inputs"]
    stdout.print(
        f"[bold]{inputs['model']}[/] on {inputs['num_gpus']} × {inputs['gpu']} at {inputs['seq_len']} "
        f"tokens: searched {payload['searched']} candidates, {payload['legal']} legal, "
        f"{payload['fit']} fit (margin {100 * inputs['memory_margin']:.0f}%)"
    )
    if inputs.get("peft"):
        stdout.print(peft_text(inputs["peft"]))
    if inputs.get("doc_lengths") and payload["plans"]:
        stdout.print(packing_text(inputs["doc_lengths"], payload["plans"][0].get("packing")), highlight=False)
    if not payload["plans"]:
        need = payload.get("min_gpus_needed")
        stdout.print(
            f"[red]no layout fits[/] on {inputs['num_gpus']} GPUs"
            + (f"; the smallest count that fits is {need} GPUs" if need else "; none fits on up to 16× the GPUs")
        )
        odd = odd_factor(int(inputs["num_gpus"]))
        if odd > rq.SMALL_ODD_PART:
            stdout.print(
                f"{inputs['num_gpus']} = {int(inputs['num_gpus']) // odd} × {odd}: TP, CP, EP and PP must divide the "
                f"GPU count, so the factor {odd} can only go to data parallelism; a count with small factors "
                "(a power of two, or a multiple of the node size) leaves the layout more room"
            )
        fewer = payload.get("fewer_gpus_that_fit")
        if fewer:
            stdout.print(
                f"fewer GPUs fit as well: {fewer} = {fewer // odd_factor(fewer)} × {odd_factor(fewer)} (the largest "
                f"count below {inputs['num_gpus']} with small factors that fits)"
            )
        closest = payload.get("closest")
        if closest:
            stdout.print(closest_text(closest), highlight=False)
        return
    from lcmoe.cli.plan_view import print_plans

    print_plans(stdout, payload, plans_title(payload))  # a table when it fits the width, else cards
    for note in [at_risk_note(payload), *model_notes(payload), *ranking_notes(payload)]:
        if note:
            stdout.print(note, highlight=False)
    for i, p in enumerate(payload["plans"][:3]):
        stdout.print(f"[bold]plan {i + 1}[/] — why:")
        for reason in p["reasons"]:
            stdout.print(f"  [{reason['rule']}] {reason['text']}", highlight=False)
    ref = payload.get("reference")
    if ref:
        stdout.print(reference_text(ref), highlight=False)
