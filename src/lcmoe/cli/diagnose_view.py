"""How ``lcmoe diagnose`` prints an out-of-memory verdict (the JSON is ``OomDiagnosis.as_dict``)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from lcmoe.cli.common import stdout
from lcmoe.report.strings import component_name  # the report's plain names for memory components

GIB = 1024.0**3


def render_oom(oom: dict[str, Any]) -> None:
    """The OOM verdict: stages over (never a negative "over"), the log's evidence, the rungs that
    fit (the ladder offered), then every rejected rung with the test it failed."""
    stdout.print("[bold red]out of memory[/]")
    for stage in oom.get("over_stages", []):
        parts = ", ".join(f"{component_name(k)} {v / GIB:.1f}" for k, v in stage["largest_components"].items())
        over = stage["over_bytes"]
        where = (
            f"{over / GIB:.1f} GiB over capacity"
            if over > 0
            else f"fits with {stage.get('free_bytes', -over) / GIB:.1f} GiB free, inside the safety margin"
        )
        stdout.print(
            f"  stage {stage['stage']}: predicted {stage['peak_reserved_bytes'] / GIB:.1f} GiB, {where}; "
            f"largest: {parts} GiB",
            highlight=False,
        )
    for note in oom.get("evidence", []):
        stdout.print(f"  evidence: {escape(str(note))}", highlight=False)
    ladder = oom.get("ladder", [])
    offered = [rung for rung in ladder if rung.get("offered")]
    rejected = [rung for rung in ladder if not rung.get("offered")]
    if ladder:
        need = oom.get("needed_drop_bytes") or 0.0
        goal = f"; the predicted peak must fall by at least {need / GIB:.1f} GiB" if need > 0 else ""
        stdout.print(f"  remediation ladder (one change each to the failing config, least intrusive first{goal}):")
    for rung in offered:
        stdout.print(
            f"    [green]fits[/] {escape(rung['change'])} [{rung['rule'] or '-'}]: peak "
            f"{rung['peak_reserved_bytes'] / GIB:.1f} GiB ({rung['peak_change_bytes'] / GIB:+.1f}), "
            f"{rung['reason']}; throughput {100 * rung['throughput_change']:+.1f}%",
            highlight=False,
        )
    if ladder and not offered:
        stdout.print("    (no single change fits)")
    if rejected:
        stdout.print("  rejected:")
    for rung in rejected:
        stdout.print(f"    {escape(rung['change'])}: {escape(rung['reason'])}", highlight=False)
    if oom.get("recommended"):
        stdout.print(f"  [bold]recommended:[/] {escape(oom['recommended']['change'])}", highlight=False)
        fastest = oom.get("fastest")
        if fastest and fastest["change"] != oom["recommended"]["change"]:
            stdout.print(f"  fastest that fits: {escape(fastest['change'])}", highlight=False)
    elif oom.get("min_gpus_needed"):
        stdout.print(f"  no single change fits; the planner needs at least {oom['min_gpus_needed']} GPUs")
