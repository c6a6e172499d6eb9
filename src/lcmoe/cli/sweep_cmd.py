"""`lcmoe sweep`: the best plan at each sequence length (the guidance's CP-scaling table)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lcmoe.cli import request as rq
from lcmoe.cli import run_options as ro
from lcmoe.cli.common import JSON, print_json, stdout
from lcmoe.cli.progress import progress
from lcmoe.plan.format import AT_RISK, at_risk_note, band_text, layout_text, recompute_text

COLUMNS = ("seq", "layout", "recompute", "precision", "offload", "peak GiB", "TFLOP/s/GPU", "band", "MFU")


def _best_per_length(options: rq.PlanOptions, lengths: list[int], *, show_progress: bool) -> list[dict[str, Any]]:
    """One search per length (model, hardware and evidence resolved once), with a bar of cases."""
    request = rq.plan_request(options, seq_len=lengths[0])
    rows: list[dict[str, Any]] = []
    with progress(len(lengths), "sweep", enabled=show_progress) as advance:
        for seq in lengths:
            result = rq.search_with_progress(replace(request, seq_len=seq), quiet=True)
            rows.append({"seq_len": seq, "plan": result.plans[0].as_dict() if result.plans else None})
            advance(1)
    return rows


def _risk(plan: dict[str, Any]) -> str:
    """The at-risk mark for a plan whose peak fits by less than the error band ("" otherwise)."""
    return AT_RISK if plan["memory"].get("oom_risk") else ""


def _print_quiet(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        p = row["plan"]
        text = (
            f"{layout_text(p['layout'])} tokens/s/GPU={p['time']['tokens_per_sec_per_gpu']:.0f}"
            + (f"{_risk(p)} may OOM" if _risk(p) else "")
            if p
            else "no plan fits"
        )
        stdout.print(f"{row['seq_len']} {text}", highlight=False, soft_wrap=True)


def _cells(p: dict[str, Any]) -> list[str]:
    """A best plan's values in COLUMNS order after "seq"."""
    return [
        layout_text(p["layout"]),
        recompute_text(p),
        p["precision"],
        f"{p['optimizer_offload_fraction']:g}",
        f"{p['memory']['peak_reserved_bytes'] / 1024**3:.1f}{_risk(p)}",
        f"{p['time']['model_tflops_per_gpu']:.0f}",
        band_text(p["time"]),
        f"{100 * p['time']['mfu']:.1f}%",
    ]


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    """One table when every cell fits the width whole, else one card per sequence length (as
    `lcmoe plan` does: a value is never cut to "…")."""
    from rich.padding import Padding

    from lcmoe.cli.plan_view import fits
    from lcmoe.i18n import context_language, translate, translate_renderable

    lang = context_language()
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("layout", "recompute") else "right", no_wrap=True)
    for row in rows:
        p = row["plan"]
        cells = _cells(p) if p else ["no plan fits", *[""] * (len(COLUMNS) - 2)]
        table.add_row(str(row["seq_len"]), *cells)
    shown = translate_renderable(table, lang)
    if fits(stdout, shown):
        stdout.print(shown)
    else:
        stdout.print(translate(title, lang), highlight=False, markup=False)
        for row in rows:
            p = row["plan"]
            stdout.print(translate(f"seq {row['seq_len']}", lang), style="bold", highlight=False, markup=False)
            if p is None:
                stdout.print("  " + translate("no plan fits", lang), highlight=False, markup=False)
                continue
            card = Table.grid(padding=(0, 2), pad_edge=True)
            card.add_column(no_wrap=True)
            card.add_column(overflow="fold")
            for col, value in zip(COLUMNS[1:], _cells(p), strict=True):
                card.add_row(col, value)
            stdout.print(Padding(translate_renderable(card, lang), (0, 0, 0, 2), expand=False), highlight=False)
    note = at_risk_note({"plans": [row["plan"] for row in rows if row["plan"]]})
    if note:
        stdout.print(note, highlight=False)


def sweep(
    ctx: typer.Context,
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_lens: str = typer.Option(
        rq.SWEEP_DEFAULT, "--seq-lens", help="comma list or range of powers of two: 4k,32k,128k | 16k..256k"
    ),
    precision: str = ro.PRECISION_LIST,
    dispatchers: str = ro.DISPATCHER_LIST,
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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="one line per sequence length"),
) -> None:
    """The best plan per sequence length (the shape of the guidance's CP-scaling table)."""
    lengths = ro.seq_lengths(seq_lens, field="--seq-lens")
    options = rq.PlanOptions.from_params(ctx.params, top=1)
    rows = _best_per_length(options, lengths, show_progress=not json_output)
    if json_output:
        print_json({"model": model, "gpu": gpu, "num_gpus": gpus, "sweep": rows})
    elif quiet:
        _print_quiet(rows)
    else:
        _print_table(rows, f"best plan per sequence length — {model} on {gpus} × {gpu}")
