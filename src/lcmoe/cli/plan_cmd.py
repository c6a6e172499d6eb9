"""`lcmoe plan` and `lcmoe sweep`: search every legal layout and rank by predicted throughput."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, JSON, print_json, resolve_hardware, resolve_model, stderr, stdout
from lcmoe.cli.emit_options import DATA_PATHS, EMIT, FORCE, RUN_SCRIPT, check_emit_options, emit_plan
from lcmoe.plan.format import (
    at_risk_note,
    band_text,
    layout_text,
    model_notes,
    peft_text,
    plans_title,
    ranking_notes,
    recompute_text,
    reference_text,
)
from lcmoe.plan.payload import plan_payload

GBS = typer.Option(None, "--gbs", min=1, help="target global batch (rounded to a legal multiple)")
PRECISIONS = ro.PRECISION_LIST
DISPATCHERS = ro.DISPATCHER_LIST
TOP = typer.Option(5, "--top", min=1, max=50, help="how many plans to list")
MARGIN = typer.Option(0.05, "--margin", help="memory safety margin")
MCORE = typer.Option("0.19.2", "--megatron-core-version", help="the Megatron-Core release the rules target")
SWEEP_DEFAULT = "4k,16k,32k,64k,128k,256k"
RANK = typer.Option(
    "conservative",
    "--rank",
    help="conservative: rank by the band's lower edge of tokens/s/GPU; expected: by the prediction",
)


def _time_evidence() -> Any:
    """The measured runs behind the time bands (data/time_evidence.yaml), read once per command."""
    from importlib import resources

    import yaml

    from lcmoe.estimate.band import evidence_from_dict

    text = resources.files("lcmoe.data").joinpath("time_evidence.yaml").read_text(encoding="utf-8")
    return evidence_from_dict(yaml.safe_load(text) or {})


def _progress_search(request: Any, quiet: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from lcmoe.plan.search import search

    if quiet or not sys.stderr.isatty():
        return search(request)
    with Progress(
        TextColumn("searching layouts"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task("search", total=1)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return search(request, progress=update)


def _request(
    model: str,
    gpu: str,
    gpus: int,
    seq_len: str,
    gbs: int | None,
    precision: str | None,
    dispatchers: str | None,
    top: int,
    margin: float,
    megatron_core_version: str,
    no_offload: bool,
    no_cuda_graphs: bool,
    hardware_file: Path | None,
    hw: list[str],
    scaleout_gbps: float | None,
    gpus_per_node: int | None,
    calibration: Path | None = None,
    peft: dict[str, Any] | None = None,
    rank: str = "conservative",
    evidence: Any = None,
) -> Any:
    from lcmoe.errors import LcmoeError
    from lcmoe.plan.search import PlanRequest
    from lcmoe.run import check_precision_supported
    from lcmoe.units import parse_token_count
    from lcmoe.workload import DISPATCHERS, PRECISIONS

    spec = resolve_model(model)
    hardware = resolve_hardware(
        gpu, hardware_file=hardware_file, overrides=hw, scaleout_gbps=scaleout_gbps, gpus_per_node=gpus_per_node
    )
    if gpus < 1:
        raise LcmoeError("--gpus", gpus, "must be at least 1", "e.g. --gpus 256")
    precisions = tuple(p.strip() for p in precision.split(",")) if precision else None
    for p in precisions or ():
        if p not in PRECISIONS:
            raise LcmoeError("--precision", p, f"must be one of {', '.join(PRECISIONS)}", "e.g. bf16,fp8-blockwise")
        check_precision_supported(hardware, p)
    chosen = tuple(d.strip() for d in dispatchers.split(",")) if dispatchers else None
    for d in chosen or ():
        if d not in DISPATCHERS:
            raise LcmoeError("--dispatchers", d, f"must be among {', '.join(DISPATCHERS)}", "e.g. alltoall,deepep")
    if not 0 <= margin < 0.9:
        raise LcmoeError("--margin", margin, "must be a fraction in [0, 0.9)", "e.g. 0.05")
    if rank not in ("conservative", "expected"):
        raise LcmoeError("--rank", rank, "must be conservative or expected", "e.g. --rank expected")
    return PlanRequest(
        model=spec,
        hardware=hardware,
        num_gpus=gpus,
        seq_len=parse_token_count(seq_len),
        gbs=gbs,
        precisions=precisions,
        dispatchers=chosen,
        top_k=top,
        memory_margin=margin,
        megatron_core_version=megatron_core_version,
        allow_offload=not no_offload,
        allow_cuda_graphs=not no_cuda_graphs,
        time_coefficients=ro.time_coefficients(calibration, hardware),
        time_evidence=evidence if evidence is not None else _time_evidence(),
        rank="expected" if rank == "expected" else "conservative",
        **(peft or {}),
    )


def plan(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    gbs: int = GBS,
    precision: str = PRECISIONS,
    dispatchers: str = DISPATCHERS,
    top: int = TOP,
    margin: float = MARGIN,
    megatron_core_version: str = MCORE,
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
    rank: str = RANK,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="best plan line only"),
) -> None:
    """Search every legal layout for MODEL on GPUS × GPU at SEQ_LEN; rank by predicted tokens/s/GPU."""
    launch = dict(
        job_name=job_name,
        mounts=mounts,
        account=account,
        partition=partition,
        time_limit=time_limit,
        pip_index_url=pip_index_url,
        container=container,
        run_script=run_script,
        data_paths=data_paths,
    )
    if emit is not None:
        check_emit_options(emit, launch, force=force)
    request = _request(
        model,
        gpu,
        gpus,
        seq_len,
        gbs,
        precision,
        dispatchers,
        top,
        margin,
        megatron_core_version,
        no_offload,
        no_cuda_graphs,
        hardware_file,
        hw,
        scaleout_gbps,
        gpus_per_node,
        calibration,
        ro.peft_options(peft, lora_rank, lora_targets, lora_input_regather),
        rank,
    )
    result = _search_or_min_gpus(request, quiet or json_output)
    payload = plan_payload(request, result)
    if emit is not None and result.plans:
        emit_plan(
            emit, payload, result, steps=steps, confirmed=yes, force=force, launch=launch, quiet=quiet or json_output
        )
    if report_dir is not None:
        _write_report(request, result, Path(report_dir) / "report.html", SWEEP_DEFAULT, calibration)
    if json_output:
        print_json(payload)
    elif quiet:
        _print_quiet(payload)
    else:
        render_plans(payload)
    if not result.plans:
        raise typer.Exit(EXIT_FINDINGS)


def _search_or_min_gpus(request: Any, quiet: bool) -> Any:
    """The search; when nothing fits, also the smallest GPU count that would (LC-GPU-FEASIBLE)."""
    from lcmoe.plan.search import min_gpus_that_fit

    result = _progress_search(request, quiet)
    if not result.plans:
        result.min_gpus_needed = min_gpus_that_fit(request)
    return result


def _write_report(request: Any, result: Any, out: Path, sweep_text: str, calibration: Path | None) -> list[Path]:
    from lcmoe.report.build import build_report, write_report
    from lcmoe.units import parse_token_count

    lengths = [parse_token_count(t.strip(), field="--sweep") for t in sweep_text.split(",") if t.strip()]
    inputs, figs = build_report(
        request, result, sweep_lengths=lengths, calibration=str(calibration) if calibration else None
    )
    return write_report(out, inputs, figs)


def report(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="the HTML file (report.md is written beside it)"),
    sweep_lengths: str = typer.Option(SWEEP_DEFAULT, "--sweep", help="sequence lengths for the sweep curve"),
    gbs: int = GBS,
    precision: str = PRECISIONS,
    dispatchers: str = DISPATCHERS,
    top: int = TOP,
    margin: float = MARGIN,
    megatron_core_version: str = MCORE,
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    peft: str = ro.PEFT,
    lora_rank: int = ro.LORA_RANK,
    lora_targets: str = ro.LORA_TARGETS_OPTION,
    lora_input_regather: bool = ro.LORA_REGATHER,
    rank: str = RANK,
    json_output: bool = typer.Option(False, "--json", help="print the plan JSON the report shows"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the written paths"),
) -> None:
    """Plan and write a self-contained HTML report (and its Markdown twin) with plots to review before spending GPUs."""
    request = _request(
        model,
        gpu,
        gpus,
        seq_len,
        gbs,
        precision,
        dispatchers,
        top,
        margin,
        megatron_core_version,
        False,
        False,
        hardware_file,
        hw,
        scaleout_gbps,
        gpus_per_node,
        calibration,
        ro.peft_options(peft, lora_rank, lora_targets, lora_input_regather),
        rank,
    )
    result = _search_or_min_gpus(request, quiet or json_output)
    written = _write_report(request, result, out, sweep_lengths, calibration)
    if json_output:
        print_json(plan_payload(request, result))
    elif quiet:
        for path in written:
            stdout.print(str(path), highlight=False)
    else:
        stdout.print(f"wrote {written[0]} (self-contained), {written[1]} and {written[2]}/", highlight=False)
    if not result.plans:
        raise typer.Exit(EXIT_FINDINGS)


def _print_quiet(payload: dict[str, Any]) -> None:
    if payload["plans"]:
        best = payload["plans"][0]
        stdout.print(
            f"{layout_text(best['layout'])} {best['precision']} recompute={recompute_text(best)} "
            f"{best['dispatcher']} offload={best['optimizer_offload_fraction']:g} "
            + (f"lora=r{best['peft']['rank']} " if best.get("peft") else "")
            + f"tokens/s/GPU={best['time']['tokens_per_sec_per_gpu']:.0f}"
            + (f" band=±{best['time']['band_pct']:.0f}%" if best["time"].get("band_pct") is not None else "")
        )
    else:
        need = payload.get("min_gpus_needed")
        stdout.print(
            f"no plan fits; at least {need} GPUs needed"
            if need
            else f"no plan fits on up to 16 × {payload['inputs']['num_gpus']} GPUs"
        )


def odd_factor(num_gpus: int) -> int:
    """``num_gpus`` without its factors of two (250 → 125)."""
    return num_gpus // (num_gpus & -num_gpus)


def render_plans(payload: dict[str, Any]) -> None:
    inputs = payload["inputs"]
    stdout.print(
        f"[bold]{inputs['model']}[/] on {inputs['num_gpus']} × {inputs['gpu']} at {inputs['seq_len']} "
        f"tokens: searched {payload['searched']} candidates, {payload['legal']} legal, "
        f"{payload['fit']} fit (margin {100 * inputs['memory_margin']:.0f}%)"
    )
    if inputs.get("peft"):
        stdout.print(peft_text(inputs["peft"]))
    if not payload["plans"]:
        need = payload.get("min_gpus_needed")
        stdout.print(
            f"[red]no layout fits[/] on {inputs['num_gpus']} GPUs"
            + (f"; the smallest count that fits is {need} GPUs" if need else "; none fits on up to 16× the GPUs")
        )
        odd = odd_factor(int(inputs["num_gpus"]))
        if odd > 8:
            stdout.print(
                f"{inputs['num_gpus']} = {int(inputs['num_gpus']) // odd} × {odd}: TP, CP, EP and PP must divide the "
                f"GPU count, so the factor {odd} can only go to data parallelism; a count with small factors "
                "(a power of two, or a multiple of the node size) leaves the layout more room"
            )
        closest = payload.get("closest")
        if closest:
            over = closest["memory"]["peak_reserved_bytes"] - closest["memory"]["capacity_bytes"]
            stdout.print(
                f"closest: {layout_text(closest['layout'])}, {over / 1024**3:.1f} GiB over; add GPUs, "
                "lower precision, or shorten the sequence"
            )
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


def sweep(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_lens: str = typer.Option(SWEEP_DEFAULT, "--seq-lens", help="comma list"),
    precision: str = PRECISIONS,
    dispatchers: str = DISPATCHERS,
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    peft: str = ro.PEFT,
    lora_rank: int = ro.LORA_RANK,
    lora_targets: str = ro.LORA_TARGETS_OPTION,
    lora_input_regather: bool = ro.LORA_REGATHER,
    rank: str = RANK,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="one line per sequence length"),
) -> None:
    """The best plan per sequence length (the shape of the guidance's CP-scaling table)."""
    from lcmoe.units import parse_token_count

    rows: list[dict[str, Any]] = []
    evidence = _time_evidence()
    for text in ro.seq_len_texts(seq_lens, field="--seq-lens"):
        seq = parse_token_count(text.strip(), field="--seq-lens")
        request = _request(
            model,
            gpu,
            gpus,
            str(seq),
            None,
            precision,
            dispatchers,
            1,
            0.05,
            "0.19.2",
            False,
            False,
            hardware_file,
            hw,
            scaleout_gbps,
            gpus_per_node,
            calibration,
            ro.peft_options(peft, lora_rank, lora_targets, lora_input_regather),
            rank,
            evidence,
        )
        result = _progress_search(request, json_output)
        best = result.plans[0].as_dict() if result.plans else None
        rows.append({"seq_len": seq, "plan": best})
    if json_output:
        print_json({"model": model, "gpu": gpu, "num_gpus": gpus, "sweep": rows})
        return
    if quiet:
        for row in rows:
            p = row["plan"]
            text = (
                f"{layout_text(p['layout'])} tokens/s/GPU={p['time']['tokens_per_sec_per_gpu']:.0f}"
                if p
                else "no plan fits"
            )
            stdout.print(f"{row['seq_len']} {text}", highlight=False)
        return
    table = Table(title=f"best plan per sequence length — {model} on {gpus} × {gpu}")
    for col in ("seq", "layout", "recompute", "precision", "offload", "peak GiB", "TFLOP/s/GPU", "band", "MFU"):
        table.add_column(col, justify="left" if col in ("layout", "recompute") else "right")
    for row in rows:
        p = row["plan"]
        if p is None:
            table.add_row(str(row["seq_len"]), "no plan fits", "", "", "", "", "", "", "")
            continue
        table.add_row(
            str(row["seq_len"]),
            layout_text(p["layout"]),
            recompute_text(p),
            p["precision"],
            f"{p['optimizer_offload_fraction']:g}",
            f"{p['memory']['peak_reserved_bytes'] / 1024**3:.1f}",
            f"{p['time']['model_tflops_per_gpu']:.0f}",
            band_text(p["time"]),
            f"{100 * p['time']['mfu']:.1f}%",
        )
    stdout.print(table)
