"""`lcmoe report` (and `plan --report`): plan, then write a self-contained HTML report with plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lcmoe.cli import request as rq
from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, print_json, stdout
from lcmoe.cli.progress import progress
from lcmoe.plan.payload import plan_payload

if TYPE_CHECKING:
    from lcmoe.plan.search import PlanRequest, SearchResult


def write_report(
    request: PlanRequest,
    result: SearchResult,
    out: Path,
    sweep_text: str,
    calibration: Path | None,
    *,
    show_progress: bool = False,
) -> list[Path]:
    """report.html, report.md and the plots for ``request``'s result, swept over ``sweep_text``'s
    lengths (a --sweep list: ``32k,64k`` or ``16k..256k``), with a bar counting the lengths
    (the request's own length included: it is the report's sweep too)."""
    from lcmoe.report.build import build_report, write_report

    lengths = ro.seq_lengths(sweep_text, field="--sweep")
    total = len(set(lengths) | {request.seq_len})
    with progress(total, "report: sweep", enabled=show_progress) as advance:
        inputs, figs = build_report(
            request,
            result,
            sweep_lengths=lengths,
            calibration=str(calibration) if calibration else None,
            advance=advance,
        )
    return write_report(out, inputs, figs)


def report(
    ctx: typer.Context,
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="the HTML file (report.md is written beside it)"),
    sweep_lengths: str = typer.Option(
        rq.SWEEP_DEFAULT, "--sweep", help="sequence lengths for the sweep curve: a comma list or a range (16k..256k)"
    ),
    gbs: int = rq.GBS,
    precision: str = ro.PRECISION_LIST,
    dispatchers: str = ro.DISPATCHER_LIST,
    top: int = rq.TOP,
    margin: float = rq.MARGIN,
    megatron_core_version: str = rq.MCORE,
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
    json_output: bool = typer.Option(False, "--json", help="print the plan JSON the report shows"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the written paths"),
) -> None:
    """Plan and write a self-contained HTML report (and its Markdown twin) with plots to review before spending GPUs."""
    request = rq.plan_request(rq.PlanOptions.from_params(ctx.params))
    ro.seq_lengths(sweep_lengths, field="--sweep")  # a bad --sweep fails before the search
    result = rq.search_or_min_gpus(request, quiet or json_output)
    show = not (quiet or json_output)
    written = write_report(request, result, out, sweep_lengths, calibration, show_progress=show)
    if json_output:
        print_json(plan_payload(request, result))
    elif quiet:
        for path in written:
            stdout.print(str(path), highlight=False, soft_wrap=True)
    else:
        stdout.print(f"wrote {written[0]} (self-contained), {written[1]} and {written[2]}/", highlight=False)
    if not result.plans:
        raise typer.Exit(EXIT_FINDINGS)
