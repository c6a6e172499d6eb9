"""`lcmoe preflight`: whether a node is ready for the run (exit 0 / 1 / 2 by the worst check:
pass / warn / fail)."""

from __future__ import annotations

from pathlib import Path

import typer

from lcmoe.cli.common import JSON, print_json, stdout
from lcmoe.cli.diagnose_cmd import PLAN


def preflight(
    plan: Path = PLAN,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="one line: the failing and warning checks"),
) -> None:
    """Check this node before spending an allocation: versions, GPUs, dispatcher packages, environment."""
    from lcmoe.config_io.plan_json import read_plan, run_from_plan
    from lcmoe.diagnose.preflight import checks, probe_node, worst_exit_code

    run = target = None
    if plan is not None:
        doc = read_plan(plan)
        run = run_from_plan(doc)
        target = (doc.get("target") or {}).get("megatron_core") or doc["inputs"].get("megatron_core_version")
    results = checks(probe_node(), run, target_megatron_core=target)
    code = worst_exit_code(results)
    if json_output:
        print_json({"checks": [c.as_dict() for c in results], "exit_code": code})
        raise typer.Exit(code)
    if quiet:
        bad = [f"{c.status} {c.name}" for c in results if c.status != "pass"]
        stdout.print(", ".join(bad) or "all checks pass", highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    colors = {"pass": "green", "warn": "yellow", "fail": "red"}
    for c in results:
        fix = f" — fix: {c.fix}" if c.fix and c.status != "pass" else ""
        stdout.print(f"[{colors[c.status]}]{c.status:4s}[/] {c.name}: {c.detail}{fix}", highlight=False)
    raise typer.Exit(code)
