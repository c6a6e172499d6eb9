"""`lcmoe plan` and `lcmoe sweep`: search every legal layout and rank by predicted throughput."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, print_json, resolve_hardware, resolve_model, stderr, stdout


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
    )


def plan_payload(request: Any, result: Any) -> dict[str, Any]:
    """The stable JSON document of a plan search (docs/json-schema.md)."""
    from lcmoe import __version__
    from lcmoe.estimate.memory import estimate_memory
    from lcmoe.estimate.time import estimate_time
    from lcmoe.plan.reference import reference_run
    from lcmoe.plan.search import Plan
    from lcmoe.rules.legality import violations

    payload: dict[str, Any] = {
        "lcmoe_version": __version__,
        "inputs": {
            "model": request.model.name,
            "gpu": request.hardware.name,
            "num_gpus": request.num_gpus,
            "seq_len": request.seq_len,
            "gbs": request.gbs,
            "memory_margin": request.memory_margin,
            "megatron_core_version": request.megatron_core_version,
        },
        "plans": [p.as_dict() for p in result.plans],
        "fallback": result.fallback.as_dict() if result.fallback else None,
        "pareto": [
            {
                "peak_reserved_bytes": p.memory.peak_reserved_bytes,
                "tokens_per_sec_per_gpu": p.tokens_per_sec_per_gpu,
                "layout": p.as_dict()["layout"],
            }
            for p in result.pareto
        ],
        "searched": result.searched,
        "legal": result.legal,
        "fit": result.fit,
    }
    reference = reference_run(request.model, request.hardware, request.num_gpus, request.seq_len)
    if reference:
        name, run = reference
        memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
        ref = Plan(run, memory, estimate_time(run, request.time_coefficients)).as_dict()
        ref["name"] = name
        ref["violations"] = [v.as_dict() for v in violations(run, megatron_core_version=request.megatron_core_version)]
        best = result.plans[0].tokens_per_sec_per_gpu if result.plans else 0.0
        ref_speed = float(ref["time"]["tokens_per_sec_per_gpu"])  # type: ignore[index]
        ref["rank_among_plans"] = 1 + sum(p.tokens_per_sec_per_gpu > ref_speed for p in result.plans)
        ref["gap_to_best_pct"] = 100 * (1 - ref_speed / best) if best else None
        payload["reference"] = ref
    if not result.plans:
        payload["closest"] = result.closest.as_dict() if result.closest else None
        payload["min_gpus_needed"] = result.min_gpus_needed
    return payload


def plan(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    gbs: int = typer.Option(None, "--gbs", min=1, help="target global batch (rounded to a legal multiple)"),
    precision: str = typer.Option(
        None, "--precision", help="comma list, e.g. bf16,fp8-blockwise (default: all the GPU has)"
    ),
    dispatchers: str = typer.Option(None, "--dispatchers", help="comma list of alltoall,deepep,hybridep"),
    top: int = typer.Option(5, "--top", min=1, max=50),
    margin: float = typer.Option(0.05, "--margin", help="memory safety margin"),
    megatron_core_version: str = typer.Option("0.19.2", "--megatron-core-version"),
    no_offload: bool = typer.Option(False, "--no-offload", help="never offload the optimizer"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs", help="variable-length data: no CUDA graphs"),
    emit: Path = typer.Option(None, "--emit", help="write configs and launchers for the top plan to DIR"),
    steps: int = typer.Option(100, "--steps", min=1, help="training steps for the GPU-hour estimate (--emit)"),
    yes: bool = typer.Option(False, "--yes", help="confirm writing a launcher for more than 64 GPUs"),
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    json_output: bool = typer.Option(False, "--json", help="print JSON"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="best plan line only"),
) -> None:
    """Search every legal layout for MODEL on GPUS × GPU at SEQ_LEN; rank by predicted tokens/s/GPU."""
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
    )
    result = _progress_search(request, quiet or json_output)
    if not result.plans:
        from lcmoe.plan.search import min_gpus_that_fit

        result.min_gpus_needed = min_gpus_that_fit(request)
    payload = plan_payload(request, result)
    if emit is not None and result.plans:
        from lcmoe.emit.writer import write_plan_directory

        write_plan_directory(emit, payload, result, steps=steps, confirmed=yes)
    if json_output:
        print_json(payload)
    elif quiet:
        _print_quiet(payload)
    else:
        render_plans(payload)
    if not result.plans:
        raise typer.Exit(EXIT_FINDINGS)


def _layout_text(layout: dict[str, Any]) -> str:
    return (
        f"TP{layout['tp']} CP{layout['cp']} EP{layout['ep']} ETP{layout['etp']} PP{layout['pp']} "
        f"VPP{layout['vpp']} DP{layout['dp']} MBS{layout['mbs']} GBS{layout['gbs']}"
    )


def _recompute_text(plan: dict[str, Any]) -> str:
    rc = plan["recompute"]
    if rc["granularity"] == "selective":
        return ",".join(rc["modules"])
    return str(rc["granularity"])


def _print_quiet(payload: dict[str, Any]) -> None:
    if payload["plans"]:
        best = payload["plans"][0]
        stdout.print(
            f"{_layout_text(best['layout'])} {best['precision']} recompute={_recompute_text(best)} "
            f"{best['dispatcher']} offload={best['optimizer_offload_fraction']:g} "
            f"tokens/s/GPU={best['time']['tokens_per_sec_per_gpu']:.0f}"
        )
    else:
        stdout.print(f"no plan fits; at least {payload.get('min_gpus_needed') or '?'} GPUs needed")


def render_plans(payload: dict[str, Any]) -> None:
    inputs = payload["inputs"]
    stdout.print(
        f"[bold]{inputs['model']}[/] on {inputs['num_gpus']} × {inputs['gpu']} at {inputs['seq_len']} "
        f"tokens: searched {payload['searched']} candidates, {payload['legal']} legal, "
        f"{payload['fit']} fit (margin {100 * inputs['memory_margin']:.0f}%)"
    )
    if not payload["plans"]:
        need = payload.get("min_gpus_needed")
        stdout.print(
            f"[red]no layout fits[/] on {inputs['num_gpus']} GPUs"
            + (f"; the smallest count that fits is {need} GPUs" if need else "; none fits up to 16×")
        )
        closest = payload.get("closest")
        if closest:
            over = closest["memory"]["peak_reserved_bytes"] - closest["memory"]["capacity_bytes"]
            stdout.print(
                f"closest: {_layout_text(closest['layout'])}, {over / 1024**3:.1f} GiB over; add GPUs, "
                "lower precision, or shorten the sequence"
            )
        return
    table = Table(title="plans, fastest first (memory = worst stage, reserved)")
    for col in (
        "#",
        "layout",
        "recompute",
        "precision",
        "dispatcher",
        "graphs",
        "offload",
        "peak GiB / cap",
        "step s",
        "tok/s/GPU",
        "TFLOP/s/GPU",
        "MFU",
    ):
        table.add_column(col, justify="left" if col in ("layout", "recompute", "dispatcher", "graphs") else "right")
    rows = [(str(i + 1), p) for i, p in enumerate(payload["plans"])]
    if payload.get("fallback"):
        rows.append(("fallback", payload["fallback"]))
    if payload.get("reference"):
        rows.append(("guidance", payload["reference"]))
    for label, p in rows:
        mem, time = p["memory"], p["time"]
        table.add_row(
            label,
            _layout_text(p["layout"]),
            _recompute_text(p),
            p["precision"],
            p["dispatcher"],
            ",".join(p["cuda_graph_scope"]) or "-",
            f"{p['optimizer_offload_fraction']:g}",
            f"{mem['peak_reserved_bytes'] / 1024**3:.1f} / {mem['capacity_bytes'] / 1024**3:.0f}",
            f"{time['step_seconds']:.2f}",
            f"{time['tokens_per_sec_per_gpu']:.0f}",
            f"{time['model_tflops_per_gpu']:.0f}",
            f"{100 * time['mfu']:.1f}%",
        )
    stdout.print(table)
    for i, p in enumerate(payload["plans"][:3]):
        stdout.print(f"[bold]plan {i + 1}[/] — why:")
        for reason in p["reasons"]:
            stdout.print(f"  [{reason['rule']}] {reason['text']}", highlight=False)
    ref = payload.get("reference")
    if ref:
        verdict = "legal" if not ref["violations"] else "illegal: " + "; ".join(v["message"] for v in ref["violations"])
        fits = "fits" if ref["memory"]["fits"] else "does not fit"
        stdout.print(
            f"[bold]{ref['name']}[/]: {verdict}, {fits}, predicted rank {ref['rank_among_plans']} "
            f"({ref['gap_to_best_pct']:.0f}% below plan 1). The time model has no measurements of the "
            "faster layouts it prefers; treat the gap as a hypothesis to A/B, not a fact."
        )


def sweep(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_lens: str = typer.Option("4k,16k,32k,64k,128k,256k", "--seq-lens", help="comma list"),
    precision: str = typer.Option(None, "--precision"),
    dispatchers: str = typer.Option(None, "--dispatchers"),
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    json_output: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """The best plan per sequence length (the shape of the guidance's CP-scaling table)."""
    from lcmoe.units import parse_token_count

    rows: list[dict[str, Any]] = []
    for text in [t for t in seq_lens.split(",") if t.strip()]:
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
        )
        result = _progress_search(request, json_output)
        best = result.plans[0].as_dict() if result.plans else None
        rows.append({"seq_len": seq, "plan": best})
    if json_output:
        print_json({"model": model, "gpu": gpu, "num_gpus": gpus, "sweep": rows})
        return
    table = Table(title=f"best plan per sequence length — {model} on {gpus} × {gpu}")
    for col in ("seq", "layout", "recompute", "precision", "offload", "peak GiB", "TFLOP/s/GPU", "MFU"):
        table.add_column(col, justify="left" if col in ("layout", "recompute") else "right")
    for row in rows:
        p = row["plan"]
        if p is None:
            table.add_row(str(row["seq_len"]), "no plan fits", "", "", "", "", "", "")
            continue
        table.add_row(
            str(row["seq_len"]),
            _layout_text(p["layout"]),
            _recompute_text(p),
            p["precision"],
            f"{p['optimizer_offload_fraction']:g}",
            f"{p['memory']['peak_reserved_bytes'] / 1024**3:.1f}",
            f"{p['time']['model_tflops_per_gpu']:.0f}",
            f"{100 * p['time']['mfu']:.1f}%",
        )
    stdout.print(table)
